"""Must NOT type-check: a Batcher of str records fed a dataset of ints."""

from loadax import Batcher, DataLoader, RangeDataset


def join(records: list[str]) -> str:
    return "".join(records)


loader = DataLoader(Batcher(join)).batch_size(2).build(RangeDataset(0, 10))  # error expected
