"""`scripts/kimipd`: the operator's day-two commands (status, logs, verify, targets, orphans,
reconcile).

The topology comes only from the stack's outputs (`pulumi stack output`, the contract in
docs/configuration.md) and the way to reach the nodes only from the stack's config
(`kimipd:connection`, `kimipd:nodes`, the `sshPrivateKey` secret), the same settings the program
deploys with.
"""

# Exit codes shared by the commands.
OK = 0  # everything serves / every check passed
DEGRADED = 1  # something is wrong (a container, a probe, a regression, a file not collected)
DOWN = 2  # the stack is not serving (serving false, no outputs) or nothing could be reached
# The command line itself is wrong (an unknown flag, a missing argument): sysexits' EX_USAGE,
# a code no verdict uses, so a script never reads a typo as "down".
USAGE = 64
