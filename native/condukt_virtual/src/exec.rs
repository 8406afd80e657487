//! Running one command.
//!
//! `exec/5` returns `{:ok, cancel_handle}` at once; the command runs on a
//! thread of its own and, when it ends, the caller receives exactly one
//! message `{tag, outcome}` where `outcome` is
//!
//! ```text
//! {:ok, output :: binary, exit_code :: integer, dropped :: non_neg_integer}
//! {:error, :limit_exceeded, message :: binary, output :: binary}
//! {:error, :cancelled, output :: binary}
//! {:error, :internal, message :: binary}
//! ```
//!
//! `output` is stdout and stderr in the order the commands wrote them (the
//! interpreter hands them over after each command), cut at
//! `max_output_bytes`; `dropped` counts what was cut. `cancel/1` on the
//! handle stops the command at its next command boundary.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bashkit::{Bash, ExecOptions as BashExecOptions, ExecutionLimits, FileSystem, NetworkAllowlist};
use rustler::{Atom, Encoder, LocalPid, NifMap, NifResult, OwnedEnv, ResourceArc, Term};

use crate::{atoms, binary, Sandbox};

mod tags {
    rustler::atoms! { limit_exceeded, cancelled, internal }
}

/// The per-call settings, from the Elixir side's validated options.
#[derive(NifMap)]
pub struct ExecOptions {
    cwd: String,
    env: Vec<(String, String)>,
    timeout_ms: u64,
    max_output_bytes: usize,
    max_commands: usize,
    max_loop_iterations: usize,
    max_total_loop_iterations: usize,
}

/// The handle `cancel/1` acts on. The interpreter's own cancellation flag
/// only exists once the thread has built it, so a cancel that comes first
/// is remembered and applied then.
#[derive(Default)]
pub struct Cancel {
    inner: Arc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    requested: AtomicBool,
    token: Mutex<Option<Arc<AtomicBool>>>,
}

#[rustler::resource_impl]
impl rustler::Resource for Cancel {}

impl Cancel {
    pub fn cancel(&self) {
        self.inner.requested.store(true, Ordering::SeqCst);
        if let Ok(slot) = self.inner.token.lock() {
            if let Some(token) = slot.as_ref() {
                token.store(true, Ordering::SeqCst);
            }
        }
    }
}

/// The handle is released when the process that called `exec` lets go of
/// it: it received the result, or it died. In the second case the command
/// has nobody to report to, so it stops.
impl Drop for Cancel {
    fn drop(&mut self) {
        self.cancel();
    }
}

impl CancelInner {
    fn attach(&self, token: Arc<AtomicBool>) {
        if let Ok(mut slot) = self.token.lock() {
            if self.requested.load(Ordering::SeqCst) {
                token.store(true, Ordering::SeqCst);
            }
            *slot = Some(token);
        }
    }
}

/// stdout and stderr, merged in order, kept up to a limit.
struct Collector {
    kept: Vec<u8>,
    dropped: u64,
    max: usize,
}

impl Collector {
    fn push(&mut self, bytes: &[u8]) {
        let room = self.max.saturating_sub(self.kept.len());
        let take = room.min(bytes.len());
        self.kept.extend_from_slice(&bytes[..take]);
        self.dropped += (bytes.len() - take) as u64;
    }
}

enum Outcome {
    Done { output: Vec<u8>, exit_code: i32, dropped: u64 },
    Limit { message: String, output: Vec<u8> },
    Cancelled { output: Vec<u8> },
    Internal(String),
}

impl Encoder for Outcome {
    fn encode<'a>(&self, env: rustler::Env<'a>) -> Term<'a> {
        match self {
            Outcome::Done { output, exit_code, dropped } => {
                (atoms::ok(), binary(env, output), *exit_code, *dropped).encode(env)
            }
            Outcome::Limit { message, output } => {
                (atoms::error(), tags::limit_exceeded(), message, binary(env, output)).encode(env)
            }
            Outcome::Cancelled { output } => (atoms::error(), tags::cancelled(), binary(env, output)).encode(env),
            Outcome::Internal(message) => (atoms::error(), tags::internal(), message).encode(env),
        }
    }
}

pub fn start(
    sb: ResourceArc<Sandbox>,
    script: String,
    opts: ExecOptions,
    reply_to: LocalPid,
    tag: Term,
) -> NifResult<(Atom, ResourceArc<Cancel>)> {
    let mut msg_env = OwnedEnv::new();
    let saved_tag = msg_env.save(tag);
    let handle = ResourceArc::new(Cancel::default());
    let cancel = Arc::clone(&handle.inner);

    let spawned = std::thread::Builder::new()
        .name("condukt-virtual-exec".into())
        .stack_size(8 * 1024 * 1024)
        .spawn(move || {
            let outcome = run(&sb, &script, &opts, &cancel);
            // The caller may be gone; nothing to do about it then.
            let _ = msg_env.send_and_clear(&reply_to, |env| (saved_tag.load(env), outcome).encode(env));
        });

    match spawned {
        Ok(_) => Ok((atoms::ok(), handle)),
        Err(e) => Err(rustler::Error::Term(Box::new(format!("cannot start a thread: {e}")))),
    }
}

fn run(sb: &Sandbox, script: &str, opts: &ExecOptions, cancel: &CancelInner) -> Outcome {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return Outcome::Internal(format!("cannot start a runtime: {e}")),
    };

    let timeout = Duration::from_millis(opts.timeout_ms.max(1));
    let limits = ExecutionLimits::new()
        .timeout(timeout)
        .max_commands(opts.max_commands)
        .max_loop_iterations(opts.max_loop_iterations)
        .max_total_loop_iterations(opts.max_total_loop_iterations)
        // bashkit's own caps stay above ours so that ours is the one that
        // reports (with the byte counts).
        .max_stdout_bytes(opts.max_output_bytes.saturating_add(1))
        .max_stderr_bytes(opts.max_output_bytes.saturating_add(1));

    let mut builder = Bash::builder()
        .fs(Arc::clone(&sb.fs) as Arc<dyn FileSystem>)
        .cwd(&opts.cwd)
        .limits(limits);
    for (name, value) in &opts.env {
        builder = builder.env(name, value);
    }
    if let Some(transport) = &sb.network {
        // bashkit's allow-list lets everything through to the transport,
        // which evaluates the policy; the private-address check is the
        // transport's too, after the policy (net.rs).
        builder = builder
            .network(NetworkAllowlist::allow_all().block_private_ips(false))
            .http_transport(Arc::clone(transport) as Arc<dyn bashkit::HttpTransport>);
    }
    let mut bash = builder.build();
    cancel.attach(bash.cancellation_token());

    let collector = Arc::new(Mutex::new(Collector {
        kept: Vec::new(),
        dropped: 0,
        max: opts.max_output_bytes,
    }));
    let sink = Arc::clone(&collector);
    let callback: bashkit::OutputCallback = Box::new(move |stdout, stderr| {
        if let Ok(mut c) = sink.lock() {
            c.push(stdout.as_bytes());
            c.push(stderr.as_bytes());
        }
    });

    // The interpreter enforces `timeout` itself; this outer deadline only
    // catches a command that never reaches a point where it checks.
    let grace = timeout + Duration::from_secs(1);
    let result = runtime.block_on(async {
        tokio::time::timeout(grace, bash.exec_with_options(script, BashExecOptions::new().streaming(callback))).await
    });

    let (output, dropped) = match collector.lock() {
        Ok(mut c) => (std::mem::take(&mut c.kept), c.dropped),
        Err(_) => (Vec::new(), 0),
    };

    match result {
        Err(_elapsed) => Outcome::Limit {
            message: format!("execution timeout: the command ran past {} ms", opts.timeout_ms),
            output,
        },
        Ok(Ok(res)) => Outcome::Done { output, exit_code: res.exit_code, dropped },
        Ok(Err(bashkit::Error::ResourceLimit(limit))) => Outcome::Limit { message: limit.to_string(), output },
        Ok(Err(bashkit::Error::Cancelled)) => Outcome::Cancelled { output },
        // A script bash itself would reject (a syntax error, say) ends like
        // bash's own: the message on the output and exit code 2.
        Ok(Err(other)) => {
            let mut output = output;
            output.extend_from_slice(format!("bash: {other}\n").as_bytes());
            Outcome::Done { output, exit_code: 2, dropped }
        }
    }
}
