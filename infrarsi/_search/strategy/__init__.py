"""The search's pure strategy: the joint space of knobs and patches, the models (speed, censored
memory, failures), the state and budget, and the proposers (contract patches, the codemod
catalog, an LLM). Nothing here runs an execution or writes to the ledger: the driver
(``infrarsi._search``) does both, and hands the results in."""
