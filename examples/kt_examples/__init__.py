"""Kernel Tuner's vector_add and tiled matrix-multiply examples, tuned by autogen.tune_kernel
(docs/tune_kernel.md): each module defines its kernel's family with the arguments Kernel Tuner's
script passes, so that importing it (autogen show kernel_tuner.vector_add ...) serves what was tuned."""
