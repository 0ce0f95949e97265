"""The observability project: Prometheus and Alertmanager watching a kimipd serving stack.

A Pulumi project of its own (Pulumi.yaml here) whose stack reads the serving stack's outputs
through StackReference; see docs/observability.md.
"""
