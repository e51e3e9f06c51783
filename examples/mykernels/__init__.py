"""An example package of kernel families for autogen (see README, "Tune your own kernel")."""
