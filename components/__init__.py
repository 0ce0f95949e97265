"""kimipd: the Kimi-K3 prefill/decode cluster as Pulumi components."""
