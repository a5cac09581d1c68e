"""A random-access source that records its reads, for the tests of workers and processes reading their shares."""


class CountingSource:
    """``(x[i], y[i])`` of arrays (a memmap's rows), recording the indices of each ``__getitems__`` call in
    ``reads`` (``source[i]`` records ``[i]``)."""

    def __init__(self, x, y):
        self.x, self.y, self.reads = x, y, []

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices):
        self.reads.append(list(indices))
        return [(self.x[i], self.y[i]) for i in indices]
