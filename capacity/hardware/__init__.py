"""The hardware and model profiles and the roofline: the planner's, the console's and the simulator's model of a GPU."""
