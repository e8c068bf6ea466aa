"""Job type opmd: online policy mirror descent (Trinity-RFT), on GRPO's servers and loop."""
