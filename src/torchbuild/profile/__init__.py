"""The options model: profiles loaded, merged and validated into a BuildSpec, and the tables they are checked against. Imports only core."""
