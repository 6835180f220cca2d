"""Image classification on generated images: `make_images.py` writes a small labelled
dataset in both layouts the trainer reads; see docs/training.md."""
