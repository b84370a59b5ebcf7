"""How model files are stored, the parts of ``onnxnorm._io`` (reading and writing them):

- ``paths``: checking input and output paths before any work, building output folders;
- ``external``: the tensors stored as external data, where they lie, reading them in;
- ``wire``: the protobuf wire format read and written by hand, so that weights stay on disk;
- ``filesystem``: copies in the kernel, data files shared with their source, holes, and the
  temporary files that a killed run leaves behind.
"""
