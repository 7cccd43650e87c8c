"""The msgpack Packer: API, conversions, vectors, differential against msgpack-python."""
