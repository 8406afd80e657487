//! The NIF behind `Condukt.Sandbox.Virtual`.
//!
//! One sandbox is one `Sandbox` resource: a bashkit file system (an
//! in-memory root with host directories mounted into it) that outlives
//! every command, plus the settings each command is built from. A command
//! gets a fresh bashkit interpreter over that file system, so files persist
//! between `exec` calls while `cd`, `export` and variables do not.
//!
//! Nothing here blocks a BEAM scheduler:
//!
//! * file operations are short (an in-memory tree, or a host directory for a
//!   mount) and run on the dirty I/O schedulers;
//! * a command runs on a thread of its own with its own single-threaded
//!   tokio runtime and reports back with a message `{ref, result}` to the
//!   caller, so a runaway script costs one thread until bashkit's limits or
//!   the wall-clock timeout end it, never a scheduler;
//! * with a network policy, each HTTP request a script makes waits (on that
//!   thread) for the policy's answer, which the BEAM gives through
//!   `http_reply/3` (see net.rs).
//!
//! The message grammar between this library and the BEAM is written at the
//! top of net.rs and exec.rs.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bashkit::{FileSystem, FileType, FsLimits, InMemoryFs, MountableFs, PosixFs, RealFs, RealFsMode};
use rustler::{Atom, Binary, Encoder, Env, LocalPid, NifMap, NifResult, OwnedBinary, ResourceArc, Term};

mod exec;
mod net;

mod atoms {
    rustler::atoms! {
        ok,
        error,
        file,
        directory,
        symlink,
        other,
        enoent,
        eacces,
        eexist,
        eisdir,
        enotdir,
        enotempty,
        einval,
        efbig,
        eio,
    }
}

/// The home directory bashkit's default user (`sandbox`) expects.
const HOME: &str = "/home/sandbox";

/// One sandbox: the file system every command and file operation shares.
pub struct Sandbox {
    fs: Arc<MountableFs>,
    network: Option<Arc<net::PolicyTransport>>,
}

#[rustler::resource_impl]
impl rustler::Resource for Sandbox {}

/// Bounds of the in-memory file system (mounts are the host's business).
#[derive(NifMap)]
pub struct FsOptions {
    max_total_bytes: u64,
    max_file_bytes: u64,
}

/// Builds the file system shared by every command of a sandbox.
fn new_fs(opts: &FsOptions) -> Arc<MountableFs> {
    let limits = FsLimits::default()
        .max_total_bytes(opts.max_total_bytes)
        .max_file_size(opts.max_file_bytes);
    let memory = InMemoryFs::with_limits(limits);
    memory.add_dir(HOME, 0o755);
    Arc::new(MountableFs::new(Arc::new(memory)))
}

/// One runtime for the dirty-scheduler file operations: they only await the
/// file system (RealFs uses tokio's blocking pool for host files).
fn fs_runtime() -> &'static tokio::runtime::Runtime {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("condukt-virtual-fs")
            .enable_all()
            .build()
            .expect("condukt_virtual: cannot start the file-system runtime")
    })
}

pub(crate) fn binary<'a>(env: Env<'a>, bytes: &[u8]) -> Term<'a> {
    match OwnedBinary::new(bytes.len()) {
        Some(mut owned) => {
            owned.as_mut_slice().copy_from_slice(bytes);
            owned.release(env).encode(env)
        }
        // Allocation failure: say so rather than abort the VM.
        None => (atoms::error(), "out of memory").encode(env),
    }
}

/// A bashkit error as `{posix_atom, message}`, the pair the Elixir side
/// turns into a `Condukt.Sandbox.Error`.
fn fs_error<'a>(env: Env<'a>, err: &bashkit::Error) -> Term<'a> {
    (atoms::error(), (posix(err), err.to_string())).encode(env)
}

fn posix(err: &bashkit::Error) -> Atom {
    use std::io::ErrorKind as K;
    match err {
        // A file-system limit (size, count, depth): "no space", as ENOSPC/EFBIG.
        bashkit::Error::Io(io) if is_fs_limit(io) => atoms::efbig(),
        bashkit::Error::Io(io) => match io.kind() {
            K::NotFound => atoms::enoent(),
            K::PermissionDenied | K::ReadOnlyFilesystem => atoms::eacces(),
            K::AlreadyExists => atoms::eexist(),
            K::IsADirectory => atoms::eisdir(),
            K::NotADirectory => atoms::enotdir(),
            K::DirectoryNotEmpty => atoms::enotempty(),
            K::InvalidInput | K::InvalidFilename => atoms::einval(),
            K::FileTooLarge | K::StorageFull | K::QuotaExceeded => atoms::efbig(),
            _ => atoms::eio(),
        },
        bashkit::Error::ResourceLimit(_) => atoms::efbig(),
        _ => atoms::eio(),
    }
}

fn is_fs_limit(io: &std::io::Error) -> bool {
    if io.get_ref().is_some_and(|e| e.downcast_ref::<bashkit::FsLimitExceeded>().is_some()) {
        return true;
    }
    // bashkit words its limit errors this way when it does not wrap the type.
    let text = io.to_string();
    text.contains("too large") || text.contains("filesystem full") || text.contains("exceeds")
}

fn kind(t: FileType) -> Atom {
    match t {
        FileType::File => atoms::file(),
        FileType::Directory => atoms::directory(),
        FileType::Symlink => atoms::symlink(),
        _ => atoms::other(),
    }
}

/// Paths from the BEAM are absolute (the Elixir side resolves them).
fn vfs_path(path: &str) -> PathBuf {
    PathBuf::from(path)
}

/// `{:ok, sandbox}`, or `{:error, message}` for unusable HTTP options.
#[rustler::nif]
fn new<'a>(
    env: Env<'a>,
    fs: FsOptions,
    network: Option<ResourceArc<net::PolicyLink>>,
    http: net::HttpOptions,
) -> Term<'a> {
    let network = match network.map(|link| net::PolicyTransport::new(link, http)) {
        None => None,
        Some(Ok(transport)) => Some(Arc::new(transport)),
        Some(Err(why)) => return (atoms::error(), why).encode(env),
    };
    (atoms::ok(), ResourceArc::new(Sandbox { fs: new_fs(&fs), network })).encode(env)
}

/// Mounts the host directory `host` at `at`. With `within`, a list of
/// `{root, writable}`, the directory must lie inside one of the roots (after
/// symbolic links are resolved), and inside a writable one for a read-write
/// mount: the bounds of what an agent may mount.
#[rustler::nif(schedule = "DirtyIo")]
fn mount(
    sb: ResourceArc<Sandbox>,
    host: String,
    at: String,
    readonly: bool,
    within: Option<Vec<(String, bool)>>,
) -> (Atom, String) {
    let mode = if readonly { RealFsMode::ReadOnly } else { RealFsMode::ReadWrite };
    let result = check_within(&host, !readonly, within.as_deref()).and_then(|host| {
        // RealFs confines every path to its root (no `..`, no symbolic link
        // out of it); PosixFs gives it the FileSystem interface.
        fs_runtime()
            .block_on(RealFs::open(&host, mode))
            .map_err(|e| e.to_string())
            .and_then(|real| {
                let fs: Arc<dyn FileSystem> = Arc::new(PosixFs::new(real));
                sb.fs.mount(Path::new(&at), fs).map_err(|e| e.to_string())
            })
    });
    match result {
        Ok(()) => (atoms::ok(), String::new()),
        Err(why) => (atoms::error(), why),
    }
}

/// The canonical host path, when `within` allows it.
fn check_within(host: &str, writable: bool, within: Option<&[(String, bool)]>) -> Result<PathBuf, String> {
    let canonical = std::fs::canonicalize(host).map_err(|e| format!("{host}: {e}"))?;
    let Some(roots) = within else { return Ok(canonical) };
    let inside = |root: &str| std::fs::canonicalize(root).is_ok_and(|r| canonical.starts_with(r));
    if roots.iter().any(|(root, rw)| (*rw || !writable) && inside(root)) {
        Ok(canonical)
    } else if roots.iter().any(|(root, _)| inside(root)) {
        Err(format!("{host} may only be mounted read-only"))
    } else {
        Err(format!("{host} is outside the directories this sandbox lets an agent mount"))
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn read_file<'a>(env: Env<'a>, sb: ResourceArc<Sandbox>, path: String) -> Term<'a> {
    match fs_runtime().block_on(sb.fs.read_file(&vfs_path(&path))) {
        Ok(bytes) => (atoms::ok(), binary(env, &bytes)).encode(env),
        Err(e) => fs_error(env, &e),
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn write_file<'a>(env: Env<'a>, sb: ResourceArc<Sandbox>, path: String, content: Binary) -> Term<'a> {
    let path = vfs_path(&path);
    let fs = &sb.fs;
    let result = fs_runtime().block_on(async {
        if let Some(parent) = path.parent() {
            fs.mkdir(parent, true).await?;
        }
        fs.write_file(&path, content.as_slice()).await
    });
    match result {
        Ok(()) => atoms::ok().encode(env),
        Err(e) => fs_error(env, &e),
    }
}

#[rustler::nif(schedule = "DirtyIo")]
fn mkdir_p<'a>(env: Env<'a>, sb: ResourceArc<Sandbox>, path: String) -> Term<'a> {
    match fs_runtime().block_on(sb.fs.mkdir(&vfs_path(&path), true)) {
        Ok(()) => atoms::ok().encode(env),
        Err(e) => fs_error(env, &e),
    }
}

/// `{:ok, {kind, size}}`, following symbolic links.
#[rustler::nif(schedule = "DirtyIo")]
fn stat<'a>(env: Env<'a>, sb: ResourceArc<Sandbox>, path: String) -> Term<'a> {
    match fs_runtime().block_on(sb.fs.stat(&vfs_path(&path))) {
        Ok(meta) => (atoms::ok(), (kind(meta.file_type), meta.size)).encode(env),
        Err(e) => fs_error(env, &e),
    }
}

/// `{:ok, [{name, kind}]}`; the kind is the entry's own (a link is a link).
#[rustler::nif(schedule = "DirtyIo")]
fn list_dir<'a>(env: Env<'a>, sb: ResourceArc<Sandbox>, path: String) -> Term<'a> {
    match fs_runtime().block_on(sb.fs.read_dir(&vfs_path(&path))) {
        Ok(entries) => {
            let list: Vec<(String, Atom)> = entries.into_iter().map(|e| (e.name, kind(e.metadata.file_type))).collect();
            (atoms::ok(), list).encode(env)
        }
        Err(e) => fs_error(env, &e),
    }
}

#[rustler::nif]
fn exec(
    sb: ResourceArc<Sandbox>,
    script: String,
    opts: exec::ExecOptions,
    reply_to: LocalPid,
    tag: Term,
) -> NifResult<(Atom, ResourceArc<exec::Cancel>)> {
    exec::start(sb, script, opts, reply_to, tag)
}

#[rustler::nif]
fn cancel(handle: ResourceArc<exec::Cancel>) -> Atom {
    handle.cancel();
    atoms::ok()
}

#[rustler::nif]
fn policy_link(owner: LocalPid) -> ResourceArc<net::PolicyLink> {
    ResourceArc::new(net::PolicyLink::new(owner))
}

#[rustler::nif]
fn http_reply(link: ResourceArc<net::PolicyLink>, id: u64, verdict: net::Verdict) -> bool {
    link.reply(id, verdict)
}

rustler::init!("Elixir.Condukt.Sandbox.Virtual.Native");
