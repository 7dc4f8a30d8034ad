"""Supervised fine-tuning: data (data.py), batching and loss weights (batches.py), the step (step.py), and
rejection-sampling fine-tuning (rft.py). An SFT run is keelrl's training loop with `train.stage = "sft"`."""
