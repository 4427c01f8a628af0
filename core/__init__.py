"""Facts every layer shares and nothing else: the error type for wrong user input, the
ring all-reduce byte formula and the markdown table writer.

This package is the bottom of the import graph (workloads, pipedream_impl, baselines and
harness all import it; it imports none of them, nor torch or mlflow), so a fact that
several layers need has one home here instead of a copy in each.
"""
