"""The compiled passes of the risk oracle and the subproblem, and the row blocks they run over."""
