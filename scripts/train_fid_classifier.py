"""Retrain the Fashion-MNIST classifier that attn2d's FID/KID use and overwrite the shipped
weights (python/attn2d/gan/fmnist_classifier.pt). Usage: .venv/bin/python scripts/train_fid_classifier.py"""

from attn2d.gan.classifier import main

if __name__ == "__main__":
    raise SystemExit(main())
