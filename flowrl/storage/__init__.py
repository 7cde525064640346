"""What a run leaves on disk: checkpoint directories, the run-directory layout and its readers, storage
shared by the nodes of a cluster, and result records."""
