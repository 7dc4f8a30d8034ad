"""Whole post-training lifecycles that run on a laptop CPU: `keelrl demo` (demo.py), its Stream of Search
variant (search.py), and SmolLM2-135M-Instruct learning Countdown (smollm2.py)."""
