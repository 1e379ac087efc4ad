"""Pure judges: evidence in, verdict out. (The checks arrive with the verifiers issue.)"""

__all__: list[str] = []
