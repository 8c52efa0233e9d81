"""Record sources: random-access records from memory, arrays, files and databases."""
