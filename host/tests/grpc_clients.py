"""A Python gRPC client (grpcio, on grpc C-core) against mounthost's two unix sockets.

Run by host/tests/grpc_clients.rs as
    python grpc_clients.py PROTO_DIR STUB_DIR CSI_SOCK HOST_SOCK
It generates the stubs from proto/csi.proto and proto/host.proto with grpc_tools.protoc into
STUB_DIR, makes each call once without and once with the channel option
("grpc.default_authority", "localhost"), and prints one JSON object per call on stdout.
"""

import json
import os
import sys

import grpc
import grpc_tools
from grpc_tools import protoc

proto_dir, stub_dir, csi_sock, host_sock = sys.argv[1:5]

# The well-known types (google/protobuf/wrappers.proto, ...) ship inside grpc_tools.
well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
rc = protoc.main(
    [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{well_known}",
        f"--python_out={stub_dir}",
        f"--grpc_python_out={stub_dir}",
        os.path.join(proto_dir, "csi.proto"),
        os.path.join(proto_dir, "host.proto"),
    ]
)
if rc != 0:
    sys.exit(f"grpc_tools.protoc failed with {rc}")
sys.path.insert(0, stub_dir)

import csi_pb2  # noqa: E402
import csi_pb2_grpc  # noqa: E402
import host_pb2  # noqa: E402
import host_pb2_grpc  # noqa: E402

# What mounthost's docs tell such clients to set: any valid host name works, kubelet sends
# "localhost".
LOCALHOST = [("grpc.default_authority", "localhost")]


def call(name, sock, options, rpc):
    out = {"call": name, "socket": sock, "options": dict(options)}
    with grpc.insecure_channel(f"unix://{sock}", options=options) as channel:
        try:
            out["ok"] = rpc(channel)
        except grpc.RpcError as e:
            out["code"] = e.code().name
            out["details"] = e.details()
    print(json.dumps(out), flush=True)


def probe(channel):
    r = csi_pb2_grpc.IdentityStub(channel).Probe(csi_pb2.ProbeRequest(), timeout=10)
    return {"ready": r.ready.value if r.HasField("ready") else None}


def plugin_info(channel):
    r = csi_pb2_grpc.IdentityStub(channel).GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    return {"name": r.name, "vendor_version": r.vendor_version}


def health(channel):
    r = host_pb2_grpc.HostStub(channel).Health(host_pb2.HealthRequest(), timeout=10)
    return {"version": r.version, "node_id": r.node_id, "volumes": r.volumes}


print(json.dumps({"grpcio": grpc.__version__}), flush=True)
call("Probe", csi_sock, [], probe)
call("Health", host_sock, [], health)
call("Probe", csi_sock, LOCALHOST, probe)
call("GetPluginInfo", csi_sock, LOCALHOST, plugin_info)
call("Health", host_sock, LOCALHOST, health)
