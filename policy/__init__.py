"""kimipd's policy pack (pulumi-policy): the runbook's hard rules, enforced on the inputs of every
container the engine is about to create, whatever program or stack produced them."""
