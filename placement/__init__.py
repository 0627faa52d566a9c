"""Where a replica's GPUs go: a cluster of nodes whose GPUs sit in interconnect domains, the placement policies that
give a tensor-parallel replica its whole group at once inside one domain, the defragmenting step that opens room for a
waiting group, and what a pod requires of a node (docs/placement.md). Pure: no Django. The replay that judges the
policies on a stream of requests is the lab's (``simulator.placement``)."""
