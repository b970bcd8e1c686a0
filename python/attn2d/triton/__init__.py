"""attn2d's GPU kernels, written in Triton (see kernels.py). They run on CUDA tensors, and on
CPU tensors through Triton's interpreter when TRITON_INTERPRET=1 is set before triton is
imported."""
