"""``onnxnorm bench fuse``: how long ``onnxnorm fuse`` takes to rewrite a model file, against
onnxscript's ``optimize_for_ort`` and ONNX Runtime's transformers optimizer, on a decoder with
its weights inside the file and one with its weights in external data.

Each run of a tool is a fresh interpreter that imports the tool first and then times its pass:
load, optimize, save (``pass s``, with the CPU time it took, user and system); ``process s`` is
the whole process, interpreter start and imports included, and peak RSS its VmHWM. The tools
take turns (the order rotated each repetition, so that a load that comes and goes on the machine
falls on each alike); the medians of ``repeats`` runs are shown. Between runs the output is
removed and written data flushed (sync), so that no run pays for the last one's writeback.
``written`` is the disk space the output's new files take (a hard link to the input's data file,
or the input's data file named by the output, takes none; a clone shares its extents but is
counted at its size, since this file system's blocks cannot tell).

On a model with external data ``onnxnorm fuse`` runs once for each ``--data`` mode asked for
(``copy``, its default, first): ``link`` and ``reference`` write the new tensors alone.

The decoders are :mod:`onnxnorm.nn.decoder`'s Llama-style decoder (its norms spelled out as
Hugging Face writes them), exported by ``torch.onnx.export(dynamo=True)`` with random weights;
``--model`` times given files instead.
"""
