"""The lazy dataset ops: the `Dataset` contract, random-access transforms, mixing and streams."""
