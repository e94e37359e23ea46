"""Active validation of GPUs: shipped floors and the pure judgement of measured figures."""
