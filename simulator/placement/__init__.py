"""The placement lab: the replay of a stream of replica requests on a cluster (``replay``), with the defragmenting
step's moves timed (``defrag_replay``), and the oracle that migrates freely (``repack``). The policies they judge are
the product's (``placement``); docs/placement.md."""
