"""A Python gRPC client (grpcio, on grpc C-core) against mounthost's two unix sockets.

Run by host/tests/grpc_clients.rs, in one of two modes:

    python grpc_clients.py authority PROTO_DIR STUB_DIR CSI_SOCK HOST_SOCK
        Each call once without and once with the channel option
        ("grpc.default_authority", "localhost"); one JSON object per call on stdout.

    python grpc_clients.py cycle PROTO_DIR STUB_DIR CSI_SOCK --filer ... --master ... \
        --name ... --staging ... --target ... --node-id ... --version ...
        A volume's whole life through the CSI front's socket, driving every RPC the driver
        advertises and checking each answer; one `checked: grpcio <RPC>: ...` line per RPC.
        Any wrong answer raises, so the script exits non-zero.

Both generate the stubs from proto/csi.proto and proto/host.proto with grpc_tools.protoc into
STUB_DIR (a temporary directory the test owns).
"""

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

import grpc
import grpc_tools
from grpc_tools import protoc

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=["authority", "cycle"])
parser.add_argument("proto_dir")
parser.add_argument("stub_dir")
parser.add_argument("csi_sock")
parser.add_argument("host_sock", nargs="?")
parser.add_argument("--filer", help="the filer's host:port (CreateVolume's `filer`)")
parser.add_argument("--master", help="the master's host:port (GetCapacity's `master`)")
parser.add_argument("--name", help="the CSI name of the volume the cycle creates")
parser.add_argument("--staging", help="kubelet's staging path of the volume")
parser.add_argument("--target", help="kubelet's publish target of the volume in a pod")
parser.add_argument("--nothing", help="a pod's target path that holds no volume")
parser.add_argument("--node-id", help="the node id the host daemon was started with")
parser.add_argument("--version", help="the driver's vendor_version")
args = parser.parse_args()

# The well-known types (google/protobuf/wrappers.proto, ...) ship inside grpc_tools.
well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
rc = protoc.main(
    [
        "grpc_tools.protoc",
        f"-I{args.proto_dir}",
        f"-I{well_known}",
        f"--python_out={args.stub_dir}",
        f"--grpc_python_out={args.stub_dir}",
        os.path.join(args.proto_dir, "csi.proto"),
        os.path.join(args.proto_dir, "host.proto"),
    ]
)
if rc != 0:
    sys.exit(f"grpc_tools.protoc failed with {rc}")
sys.path.insert(0, args.stub_dir)

import csi_pb2  # noqa: E402
import csi_pb2_grpc  # noqa: E402
import host_pb2  # noqa: E402
import host_pb2_grpc  # noqa: E402

# What mounthost's docs tell such clients to set: any valid host name works, kubelet sends
# "localhost".
LOCALHOST = [("grpc.default_authority", "localhost")]


# --- authority: the h2 limitation and the option that avoids it ---------------------------


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


def authority():
    print(json.dumps({"grpcio": grpc.__version__}), flush=True)
    call("Probe", args.csi_sock, [], probe)
    call("Health", args.host_sock, [], health)
    call("Probe", args.csi_sock, LOCALHOST, probe)
    call("GetPluginInfo", args.csi_sock, LOCALHOST, plugin_info)
    call("Health", args.host_sock, LOCALHOST, health)


# --- cycle: every advertised RPC, answers checked -------------------------------------------

GIB = 1 << 30
# Node calls may start or stop a `weed mount` (about a second each here).
TIMEOUT = 120


class Failed(Exception):
    pass


def check(cond, what):
    """An assertion that `python -O` cannot remove."""
    if not cond:
        raise Failed(what)


def checked(rpc, what):
    print(f"checked: grpcio {rpc}: {what}", flush=True)


def refused(rpc, code, fn, what):
    """`fn()` must fail with `code`; prints the checked line with the answer's details."""
    try:
        answer = fn()
    except grpc.RpcError as e:
        check(e.code() == code, f"{rpc} {what}: {e.code().name} ({e.details()}), expected {code.name}")
        checked(rpc, f"{what}: {e.code().name} ({e.details()})")
        return
    raise Failed(f"{rpc} {what} answered OK, expected {code.name}: {answer}")


def mounts():
    """Mount point -> fstype, from this process's mountinfo (no stat: a dead FUSE mount hangs)."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            point = left.split()[4].encode().decode("unicode_escape")
            out[point] = right.split()[0]
    return out


def http_get(addr, path, headers=None):
    req = urllib.request.Request(f"http://{addr}{path}", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def master_free_slots():
    status, body = http_get(args.master, "/dir/status")
    check(status == 200, f"GET {args.master}/dir/status: {status} {body!r}")
    return json.loads(body)["Topology"]["Free"]


def multi_writer():
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_MULTI_WRITER
        ),
    )


def list_all(controller, max_entries):
    """Every ListVolumes entry, following next_token; and the number of pages."""
    entries, pages, token = [], 0, ""
    while True:
        page = controller.ListVolumes(
            csi_pb2.ListVolumesRequest(max_entries=max_entries, starting_token=token), timeout=TIMEOUT
        )
        pages += 1
        if max_entries > 0:
            check(len(page.entries) <= max_entries, f"a page of {len(page.entries)} > max_entries {max_entries}")
        entries.extend(page.entries)
        if not page.next_token:
            return entries, pages
        check(page.next_token != token, f"ListVolumes answered the token it was given: {token!r}")
        token = page.next_token
        check(pages < 100, "ListVolumes never ended")


def listed(entries):
    return {e.volume.volume_id: e.volume.capacity_bytes for e in entries}


# What each advertised capability makes a client call; every one is driven below, and an
# advertised capability missing here fails the run (so a new one cannot go undriven).
PLUGIN_CAPS = {
    ("service", csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE): "the Controller calls",
    ("volume_expansion", csi_pb2.PluginCapability.VolumeExpansion.ONLINE): "ControllerExpandVolume and "
    "NodeExpandVolume while published",
}
CTRL = csi_pb2.ControllerServiceCapability.RPC
CONTROLLER_CAPS = {
    CTRL.CREATE_DELETE_VOLUME: "CreateVolume, DeleteVolume",
    CTRL.SINGLE_NODE_MULTI_WRITER: "every capability here is SINGLE_NODE_MULTI_WRITER",
    CTRL.EXPAND_VOLUME: "ControllerExpandVolume",
    CTRL.GET_CAPACITY: "GetCapacity",
    CTRL.LIST_VOLUMES: "ListVolumes",
    CTRL.LIST_VOLUMES_PUBLISHED_NODES: "ListVolumes entries' status",
}
NODE = csi_pb2.NodeServiceCapability.RPC
NODE_CAPS = {
    NODE.STAGE_UNSTAGE_VOLUME: "NodeStageVolume, NodeUnstageVolume",
    NODE.GET_VOLUME_STATS: "NodeGetVolumeStats",
    NODE.VOLUME_CONDITION: "NodeGetVolumeStats' volume_condition",
    NODE.SINGLE_NODE_MULTI_WRITER: "every capability here is SINGLE_NODE_MULTI_WRITER",
    NODE.EXPAND_VOLUME: "NodeExpandVolume",
}


def names(enum, values):
    return sorted(enum.Name(v) for v in values)


def cycle():
    for flag in ["filer", "master", "name", "staging", "target", "nothing", "node_id", "version"]:
        check(getattr(args, flag), f"--{flag.replace('_', '-')} is required in cycle mode")
    print(f"grpcio {grpc.__version__}", flush=True)
    channel = grpc.insecure_channel(f"unix://{args.csi_sock}", options=LOCALHOST)
    identity = csi_pb2_grpc.IdentityStub(channel)
    controller = csi_pb2_grpc.ControllerStub(channel)
    node = csi_pb2_grpc.NodeStub(channel)
    cap = multi_writer()
    staging, target = args.staging, args.target

    # --- Identity
    info = identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=TIMEOUT)
    check(info.name == "csi.mounthost.dev", f"GetPluginInfo name: {info}")
    check(info.vendor_version == args.version, f"GetPluginInfo vendor_version: {info}")
    checked("GetPluginInfo", f"{info.name} {info.vendor_version}")

    plugin_caps = identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=TIMEOUT)
    got = set()
    for c in plugin_caps.capabilities:
        kind = c.WhichOneof("type")
        got.add((kind, getattr(c, kind).type))
    check(got == set(PLUGIN_CAPS), f"GetPluginCapabilities: {got}, driven here: {set(PLUGIN_CAPS)}")
    checked("GetPluginCapabilities", "CONTROLLER_SERVICE, VolumeExpansion ONLINE (exactly)")

    ready = identity.Probe(csi_pb2.ProbeRequest(), timeout=TIMEOUT)
    check(ready.HasField("ready") and ready.ready.value, f"Probe: {ready}")
    checked("Probe", "ready (the host daemon answers)")

    # --- Capabilities and node info
    ctrl_caps = controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest(), timeout=TIMEOUT)
    got = {c.rpc.type for c in ctrl_caps.capabilities if c.WhichOneof("type") == "rpc"}
    check(
        got == set(CONTROLLER_CAPS),
        f"ControllerGetCapabilities: {names(CTRL.Type, got)}, driven here: {names(CTRL.Type, CONTROLLER_CAPS)}",
    )
    checked("ControllerGetCapabilities", ", ".join(names(CTRL.Type, got)) + " (exactly)")

    node_caps = node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest(), timeout=TIMEOUT)
    got = {c.rpc.type for c in node_caps.capabilities if c.WhichOneof("type") == "rpc"}
    check(
        got == set(NODE_CAPS),
        f"NodeGetCapabilities: {names(NODE.Type, got)}, driven here: {names(NODE.Type, NODE_CAPS)}",
    )
    checked("NodeGetCapabilities", ", ".join(names(NODE.Type, got)) + " (exactly)")

    node_info = node.NodeGetInfo(csi_pb2.NodeGetInfoRequest(), timeout=TIMEOUT)
    check(node_info.node_id == args.node_id, f"NodeGetInfo: {node_info}, expected node id {args.node_id}")
    checked("NodeGetInfo", f"node_id {node_info.node_id}")

    # --- GetCapacity: the master's free volume slots of 1024 MiB each.
    params = {"plugin": "seaweedfs", "filer": args.filer}
    before = master_free_slots()
    capacity = controller.GetCapacity(
        csi_pb2.GetCapacityRequest(
            volume_capabilities=[cap],
            parameters={**params, "master": args.master, "masterVolumeSizeLimitMB": "1024"},
        ),
        timeout=TIMEOUT,
    )
    after = master_free_slots()
    free = capacity.available_capacity
    check(free > 0, f"GetCapacity: {capacity}")
    check(
        min(before, after) * GIB <= free <= max(before, after) * GIB,
        f"GetCapacity {free} bytes, the master has {before}..{after} free slots of 1 GiB",
    )
    checked("GetCapacity", f"{free} bytes available ({free // GIB} free slots of 1 GiB on the master)")

    # --- CreateVolume: 1 GiB; again with the same arguments, the same volume (idempotent).
    create = csi_pb2.CreateVolumeRequest(
        name=args.name,
        capacity_range=csi_pb2.CapacityRange(required_bytes=GIB),
        volume_capabilities=[cap],
        parameters=params,
    )
    vol = controller.CreateVolume(create, timeout=TIMEOUT).volume
    check(vol.capacity_bytes == GIB, f"CreateVolume capacity: {vol}")
    check(vol.volume_id.startswith(f"seaweedfs~{args.filer}/"), f"CreateVolume id: {vol}")
    path = vol.volume_context["path"]
    check(path == f"/buckets/{args.name}", f"CreateVolume context path: {vol}")
    again = controller.CreateVolume(create, timeout=TIMEOUT).volume
    check(again.volume_id == vol.volume_id and again.capacity_bytes == GIB, f"CreateVolume again: {again}")
    # A second, unsized volume, so that ListVolumes has pages to follow.
    other = controller.CreateVolume(
        csi_pb2.CreateVolumeRequest(name=f"{args.name}-other", volume_capabilities=[cap], parameters=params),
        timeout=TIMEOUT,
    ).volume
    check(other.capacity_bytes == 0 and other.volume_id != vol.volume_id, f"CreateVolume unsized: {other}")
    status, body = http_get(args.filer, f"{path}/", {"Accept": "application/json"})
    check(status == 200, f"the volume's directory {path} in the filer: {status} {body!r}")
    checked("CreateVolume", f"{vol.volume_id}, {vol.capacity_bytes} bytes, its directory in the filer; again: the same")

    # --- ValidateVolumeCapabilities
    validate = csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=vol.volume_id, volume_context=vol.volume_context, volume_capabilities=[cap]
    )
    valid = controller.ValidateVolumeCapabilities(validate, timeout=TIMEOUT)
    check(valid.HasField("confirmed"), f"ValidateVolumeCapabilities: {valid}")
    check(list(valid.confirmed.volume_capabilities) == [cap], f"ValidateVolumeCapabilities confirmed: {valid}")
    checked("ValidateVolumeCapabilities", "confirmed SINGLE_NODE_MULTI_WRITER mount")

    # --- ListVolumes: all at once, and one per page following next_token.
    want = {vol.volume_id: GIB, other.volume_id: 0}
    entries, _ = list_all(controller, 0)
    check(listed(entries) == want, f"ListVolumes: {listed(entries)}, expected {want}")
    for e in entries:
        check(e.HasField("status") and list(e.status.published_node_ids) == [], f"ListVolumes status: {e}")
    entries, pages = list_all(controller, 1)
    check(listed(entries) == want, f"ListVolumes max_entries=1: {listed(entries)}, expected {want}")
    check(pages >= 2, f"ListVolumes max_entries=1: {pages} pages for 2 volumes")
    checked("ListVolumes", f"both volumes with their capacity; max_entries=1: {pages} pages via next_token")
    refused(
        "ListVolumes",
        grpc.StatusCode.ABORTED,
        lambda: controller.ListVolumes(csi_pb2.ListVolumesRequest(starting_token="not-a-token"), timeout=TIMEOUT),
        "starting_token 'not-a-token'",
    )

    # --- NodeStageVolume (publish before it: FAILED_PRECONDITION)
    publish = csi_pb2.NodePublishVolumeRequest(
        volume_id=vol.volume_id,
        staging_target_path=staging,
        target_path=target,
        volume_capability=cap,
        volume_context=vol.volume_context,
    )
    refused(
        "NodePublishVolume",
        grpc.StatusCode.FAILED_PRECONDITION,
        lambda: node.NodePublishVolume(publish, timeout=TIMEOUT),
        "before NodeStageVolume",
    )
    stage = csi_pb2.NodeStageVolumeRequest(
        volume_id=vol.volume_id,
        staging_target_path=staging,
        volume_capability=cap,
        volume_context=vol.volume_context,
    )
    node.NodeStageVolume(stage, timeout=TIMEOUT)
    node.NodeStageVolume(stage, timeout=TIMEOUT)
    check(staging in mounts(), f"nothing mounted at the staging path {staging}")
    checked("NodeStageVolume", f"{mounts()[staging]} at the staging path; again: OK")

    # --- NodePublishVolume, then a pod's write through the target, read back and seen by the filer.
    node.NodePublishVolume(publish, timeout=TIMEOUT)
    node.NodePublishVolume(publish, timeout=TIMEOUT)
    check(target in mounts(), f"nothing mounted at the target {target}")
    content = f"written by grpcio {grpc.__version__} through {target}\n"
    with open(os.path.join(target, "hello.txt"), "w") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    with open(os.path.join(target, "hello.txt")) as f:
        back = f.read()
    check(back == content, f"read back {back!r}, wrote {content!r}")
    until = time.monotonic() + 30
    while True:
        status, body = http_get(args.filer, f"{path}/hello.txt")
        if status == 200 and body.decode() == content:
            break
        check(time.monotonic() < until, f"the filer has {path}/hello.txt as {status} {body!r}, wrote {content!r}")
        time.sleep(0.2)
    checked(
        "NodePublishVolume",
        f"{mounts()[target]} at the target; again: OK; a file written there read back and read from the "
        f"filer at {path}/hello.txt",
    )

    # --- NodeGetVolumeStats, at the target and at the staging path.
    for where in [target, staging]:
        stats = node.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.volume_id, volume_path=where, staging_target_path=staging),
            timeout=TIMEOUT,
        )
        usage = {u.unit: u for u in stats.usage}
        check(set(usage) == {csi_pb2.VolumeUsage.BYTES, csi_pb2.VolumeUsage.INODES}, f"NodeGetVolumeStats: {stats}")
        b = usage[csi_pb2.VolumeUsage.BYTES]
        # weed mount's statfs reports the volume's quota (its capacity record) as the total.
        check(b.total == GIB and 0 <= b.used <= b.total, f"NodeGetVolumeStats bytes at {where}: {stats}")
        check(0 <= b.available <= b.total, f"NodeGetVolumeStats bytes at {where}: {stats}")
        check(stats.HasField("volume_condition"), f"NodeGetVolumeStats has no condition: {stats}")
        check(not stats.volume_condition.abnormal, f"NodeGetVolumeStats condition abnormal at {where}: {stats}")
        name = "target" if where == target else "staging path"
        checked(
            "NodeGetVolumeStats",
            f"{name}: bytes total {b.total} used {b.used} available {b.available}, inodes used "
            f"{usage[csi_pb2.VolumeUsage.INODES].used}; condition {stats.volume_condition.message!r}",
        )
    refused(
        "NodeGetVolumeStats",
        grpc.StatusCode.NOT_FOUND,
        lambda: node.NodeGetVolumeStats(
            csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.volume_id, volume_path=args.nothing), timeout=TIMEOUT
        ),
        "at a path that holds nothing",
    )

    # --- ControllerExpandVolume to 2 GiB: the node must follow.
    grown = controller.ControllerExpandVolume(
        csi_pb2.ControllerExpandVolumeRequest(
            volume_id=vol.volume_id, capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GIB), volume_capability=cap
        ),
        timeout=TIMEOUT,
    )
    check(grown.capacity_bytes == 2 * GIB and grown.node_expansion_required, f"ControllerExpandVolume: {grown}")
    entries, _ = list_all(controller, 0)
    check(listed(entries).get(vol.volume_id) == 2 * GIB, f"ListVolumes after the expansion: {listed(entries)}")
    checked("ControllerExpandVolume", f"{grown.capacity_bytes} bytes, node_expansion_required; ListVolumes says so")

    # --- NodeExpandVolume, online at the pod's target; at a path that holds nothing: NOT_FOUND.
    def node_expand(where):
        return node.NodeExpandVolume(
            csi_pb2.NodeExpandVolumeRequest(
                volume_id=vol.volume_id,
                volume_path=where,
                staging_target_path=staging,
                capacity_range=csi_pb2.CapacityRange(required_bytes=2 * GIB),
                volume_capability=cap,
            ),
            timeout=TIMEOUT,
        )

    nowhere = "at a path that holds nothing"
    refused("NodeExpandVolume", grpc.StatusCode.NOT_FOUND, lambda: node_expand(args.nothing), nowhere)
    expanded = node_expand(target)
    check(expanded.capacity_bytes == 2 * GIB, f"NodeExpandVolume: {expanded}")
    # The running mount was told: what the pod's statfs reports (weed's quota) is the new size.
    stats = node.NodeGetVolumeStats(
        csi_pb2.NodeGetVolumeStatsRequest(volume_id=vol.volume_id, volume_path=target, staging_target_path=staging),
        timeout=TIMEOUT,
    )
    total = {u.unit: u.total for u in stats.usage}.get(csi_pb2.VolumeUsage.BYTES)
    check(total == 2 * GIB, f"NodeGetVolumeStats after NodeExpandVolume: {stats}")
    check(not stats.volume_condition.abnormal, f"NodeGetVolumeStats after NodeExpandVolume: {stats}")
    checked("NodeExpandVolume", f"{expanded.capacity_bytes} bytes at the target, published; the pod's statfs: {total}")

    # --- NodeUnpublishVolume, NodeUnstageVolume (each twice: the second finds nothing, OK).
    unpublish = csi_pb2.NodeUnpublishVolumeRequest(volume_id=vol.volume_id, target_path=target)
    node.NodeUnpublishVolume(unpublish, timeout=TIMEOUT)
    node.NodeUnpublishVolume(unpublish, timeout=TIMEOUT)
    check(target not in mounts(), f"the target {target} is still mounted")
    checked("NodeUnpublishVolume", "the target unmounted; again: OK")
    unstage = csi_pb2.NodeUnstageVolumeRequest(volume_id=vol.volume_id, staging_target_path=staging)
    node.NodeUnstageVolume(unstage, timeout=TIMEOUT)
    node.NodeUnstageVolume(unstage, timeout=TIMEOUT)
    check(staging not in mounts(), f"the staging path {staging} is still mounted")
    checked("NodeUnstageVolume", "the staging path unmounted; again: OK")

    # --- DeleteVolume: gone from the filer, from ListVolumes, and ValidateVolumeCapabilities NOT_FOUND.
    for v in [vol, other]:
        controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=v.volume_id), timeout=TIMEOUT)
    controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id), timeout=TIMEOUT)
    status, body = http_get(args.filer, f"{path}/", {"Accept": "application/json"})
    check(status == 404, f"the deleted volume's directory {path} in the filer: {status} {body!r}")
    entries, _ = list_all(controller, 0)
    check(listed(entries) == {}, f"ListVolumes after DeleteVolume: {listed(entries)}")
    checked("DeleteVolume", f"{path} gone from the filer, nothing listed; again: OK")
    refused(
        "ValidateVolumeCapabilities",
        grpc.StatusCode.NOT_FOUND,
        lambda: controller.ValidateVolumeCapabilities(validate, timeout=TIMEOUT),
        "after DeleteVolume",
    )
    channel.close()
    print("cycle: done", flush=True)


if args.mode == "authority":
    check(args.host_sock, "authority mode needs HOST_SOCK")
    authority()
else:
    cycle()
