"""Data tools: procedural triplets (`synth`), triplet manifests and dataset indexers (`index`),
WebDataset shards (`shards`), real pictures from package registries (`pictures`) and teacher triplets
(`teach`); `python -m data_tools <tool>` runs one."""

