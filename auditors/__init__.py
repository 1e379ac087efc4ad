"""libcst source audits of patches and training loops. (Rules arrive with the auditors issue.)"""

__all__: list[str] = []
