"""Studies: a declared question answered end to end (``python -m modforge.study``): each arm tuned alike, compared on
fresh paired seeds added where the answer is still open, on a ladder of sizes, within a budget, in one report."""
