"""The message classes of MindSpore's checkpoint.proto, built with the `protobuf` library from a
descriptor written here in Python (no .proto file, no protoc at build or run time):

    syntax = "proto2";
    message TensorProto { repeated int64 dims = 1; optional string tensor_type = 2;
                          optional bytes tensor_content = 3; }
    message Checkpoint {
      message Value { optional string tag = 1; optional TensorProto tensor = 2; }
      repeated Value value = 1;
    }

Differences from MindSpore 2.10's file (its mindspore/train/checkpoint_pb2.py) that leave the
bytes on the wire the same: the fields are `optional` where MindSpore says `required` (a missing
one is reported by checkpoint.py with the file's name, not by protobuf); `tag` and
`tensor_type` are declared `bytes` (a string on the wire) so that a name that is not UTF-8 is
decoded, and reported, here; MindSpore's Value holds `tensor` in a oneof beside
`MapTensorProto maptensor = 3`, which this descriptor leaves out: protobuf skips it as an
unknown field, and checkpoint.py skips a Value without a tensor. `dims` is unpacked, as
MindSpore writes it; protobuf reads packed dims as well. The descriptor lives in its own pool,
so it cannot clash with MindSpore's own in one process."""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

_F = descriptor_pb2.FieldDescriptorProto


def _field(name: str, number: int, kind: int, label: int = _F.LABEL_OPTIONAL,
           type_name: str = "") -> descriptor_pb2.FieldDescriptorProto:
    field = _F(name=name, number=number, type=kind, label=label)
    if type_name:  # set only for message fields: protobuf refuses it on the others
        field.type_name = type_name
    return field


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(name="graphkernel/checkpoint.proto",
                                               package="graphkernel.ckpt", syntax="proto2")
    proto.message_type.add(name="TensorProto", field=[
        _field("dims", 1, _F.TYPE_INT64, _F.LABEL_REPEATED),
        _field("tensor_type", 2, _F.TYPE_BYTES),
        _field("tensor_content", 3, _F.TYPE_BYTES)])
    checkpoint = proto.message_type.add(name="Checkpoint", field=[
        _field("value", 1, _F.TYPE_MESSAGE, _F.LABEL_REPEATED,
               ".graphkernel.ckpt.Checkpoint.Value")])
    checkpoint.nested_type.add(name="Value", field=[
        _field("tag", 1, _F.TYPE_BYTES),
        _field("tensor", 2, _F.TYPE_MESSAGE, type_name=".graphkernel.ckpt.TensorProto")])
    return proto


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
Checkpoint = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("graphkernel.ckpt.Checkpoint"))
TensorProto = message_factory.GetMessageClass(
    _POOL.FindMessageTypeByName("graphkernel.ckpt.TensorProto"))
