"""Whole post-training lifecycles that run on a laptop CPU: `keelrl demo` (demo.py), its Stream of Search
variant, and SmolLM2-135M-Instruct learning Countdown (smollm2.py)."""
