"""Where a replica's GPUs go: a cluster of nodes whose GPUs sit in interconnect domains, the placement policies that
give a tensor-parallel replica its whole group at once inside one domain, and a replay of a stream of replica requests
under each policy (docs/placement.md). Pure: no Django."""
