#!/usr/bin/env python3
"""Writes an OCI image archive (an OCI image layout in a tar file) from a
root file system directory: one gzip layer, a config, a manifest and an
index, all byte-for-byte reproducible for the same tree and the same
SOURCE_DATE_EPOCH (sorted entries, fixed times, numeric owners, gzip
without a name or time). No registry, no daemon: containerd
(`ctr images import`), podman (`podman load`) and skopeo read the result.

  oci.py ROOTFS ARCHIVE --name REPO:TAG [--user U] [--entrypoint JSON]
         [--cmd JSON] [--env K=V ...] [--label K=V ...]

Layout references (OCI image-spec v1.1): image-layout.md (oci-layout,
index.json, blobs/sha256), manifest.md, config.md, descriptor.md.
"""
import argparse, gzip, hashlib, io, json, os, stat, sys, tarfile

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
# What a container runtime provides itself: kept as empty directories.
EMPTY_DIRS = {"dev", "proc", "sys", "run", "tmp"}


def layer_tar(root):
    """The root file system as an uncompressed tar, deterministic."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            rel_dir = os.path.relpath(dirpath, root)
            top = rel_dir.split(os.sep)[0]
            if rel_dir != "." and top in EMPTY_DIRS:
                dirnames[:] = []
                continue
            dirnames.sort()
            names = sorted(dirnames + filenames)
            for name in names:
                path = os.path.join(dirpath, name)
                arc = os.path.normpath(os.path.join(rel_dir, name))
                info = tar.gettarinfo(path, arcname=arc)
                info.mtime = min(int(info.mtime), EPOCH) if EPOCH else 0
                info.uname = info.gname = ""
                if arc in EMPTY_DIRS:
                    info.mode = 0o1777 if arc == "tmp" else 0o755
                if info.isreg():
                    with open(path, "rb") as f:
                        tar.addfile(info, f)
                elif info.isdir() or info.issym() or info.islnk():
                    tar.addfile(info)
                # Device nodes, fifos and sockets are the runtime's business.
    return buf.getvalue()


def blob(data):
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def kv(pairs):
    out = {}
    for p in pairs or []:
        k, sep, v = p.partition("=")
        if not sep:
            sys.exit(f"oci.py: {p!r} is not KEY=VALUE")
        out[k] = v
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rootfs")
    ap.add_argument("archive")
    ap.add_argument("--name", required=True, help="full reference, e.g. ghcr.io/o/img:1.0")
    ap.add_argument("--user", default="")
    ap.add_argument("--entrypoint", default="null")
    ap.add_argument("--cmd", default="null")
    ap.add_argument("--env", action="append")
    ap.add_argument("--label", action="append")
    a = ap.parse_args()

    tag = a.name.rsplit(":", 1)[1] if ":" in a.name.rsplit("/", 1)[-1] else "latest"
    raw = layer_tar(a.rootfs)
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, filename="") as g:
        g.write(raw)
    layer_digest, layer = blob(gz.getvalue())

    created = __import__("datetime").datetime.fromtimestamp(EPOCH, __import__("datetime").timezone.utc)
    created = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    env = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"] + [f"{k}={v}" for k, v in kv(a.env).items()]
    cfg = {"Env": env, "Labels": kv(a.label)}
    if a.user:
        cfg["User"] = a.user
    if json.loads(a.entrypoint) is not None:
        cfg["Entrypoint"] = json.loads(a.entrypoint)
    if json.loads(a.cmd) is not None:
        cfg["Cmd"] = json.loads(a.cmd)
    config = {
        "created": created,
        "architecture": "amd64",
        "os": "linux",
        "config": cfg,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "condukt scripts/image/build.sh"}],
    }
    config_digest, config_bytes = blob(json.dumps(config, sort_keys=True, separators=(",", ":")).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": len(config_bytes)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest, "size": len(layer)}],
        "annotations": {"org.opencontainers.image.created": created},
    }
    manifest_digest, manifest_bytes = blob(json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode())
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": len(manifest_bytes),
            "platform": {"architecture": "amd64", "os": "linux"},
            # containerd names the image after the first, podman and skopeo
            # after the second.
            "annotations": {"io.containerd.image.name": a.name, "org.opencontainers.image.ref.name": tag},
        }],
    }
    files = [
        ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
        ("index.json", json.dumps(index, sort_keys=True, separators=(",", ":")).encode()),
    ]
    for digest, data in ((config_digest, config_bytes), (manifest_digest, manifest_bytes), (layer_digest, layer)):
        files.append(("blobs/sha256/" + digest.split(":", 1)[1], data))

    tmp = a.archive + ".tmp"
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as out:
        for d in ("blobs", "blobs/sha256"):
            ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; ti.mtime = EPOCH
            out.addfile(ti)
        for name, data in files:
            ti = tarfile.TarInfo(name); ti.size = len(data); ti.mode = 0o644; ti.mtime = EPOCH
            out.addfile(ti, io.BytesIO(data))
    os.replace(tmp, a.archive)
    print(json.dumps({"archive": a.archive, "name": a.name, "manifest": manifest_digest,
                      "layer_bytes": len(layer), "uncompressed_bytes": len(raw)}))


if __name__ == "__main__":
    main()
