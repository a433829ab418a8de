"""Everything read from disk or the hub: model directories, the reference checkpoint converter, external
weights and their cache, hub pulls, triplet manifests, and the checks of files a user names."""
