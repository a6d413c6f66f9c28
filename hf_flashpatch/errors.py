"""Exceptions shared by the API, the kernels and the backend."""


class KernelUnsupported(RuntimeError):
    """A CUDA kernel cannot serve this call (arch, head dim, dtype, missing pycuda/nvcc, ...).

    The public API catches it and takes the documented fallback, warning once with the message.
    """


class PagePoolExhausted(RuntimeError):
    """A paged KV cache has no free page left for the tokens being appended; nothing was written."""


class UnsupportedModel(TypeError):
    """No hf_flashpatch attention name can serve this model at all (see hf_flashpatch/backend/unpatchable.py):
    ``patch()`` and the registered mask function raise it rather than leave the model silently unpatched or
    let it fail deep inside its own modeling code."""
