//! The network policy at the interpreter's HTTP boundary.
//!
//! bashkit hands every HTTP request a script makes (`curl`, `wget`, `http`,
//! each hop of a redirect chain) to one `HttpTransport`. Ours asks the BEAM
//! first and opens a connection only when the policy allowed it.
//!
//! Messages, between the transport (on a command's thread) and the
//! sandbox's policy process (the `owner` of the `PolicyLink`):
//!
//! ```text
//! to the owner:   {:condukt_virtual_http, id, method, url, [{name, value}]}
//! its answer:     http_reply(link, id, {:allow, private_ok :: boolean})
//!                 http_reply(link, id, {:deny, text :: binary})
//! to the owner:   {:condukt_virtual_http_done, id, outcome}, once per allowed request:
//!   {:closed, status, [{name, value}], bytes_in, bytes_out}
//!   {:failed, reason :: binary, bytes_in, bytes_out}
//!   {:refused, reason :: binary}      (allowed by the policy, refused here)
//! ```
//!
//! `id` is unique per link. A request whose answer does not come within
//! `answer_timeout_ms` is refused (fail closed), as is every request once
//! the owner is gone.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use bashkit::{HttpResponse, HttpTransport, HttpTransportError, HttpTransportRequest};
use rustler::{Encoder, LocalPid, NifMap, NifTaggedEnum, OwnedEnv, ResourceArc};
use tokio::sync::oneshot;

mod tags {
    rustler::atoms! { condukt_virtual_http, condukt_virtual_http_done, closed, failed, refused }
}

/// The policy's answer for one request.
#[derive(NifTaggedEnum)]
pub enum Verdict {
    /// Allowed; `true` when the policy named the address itself, so a
    /// private or loopback address may be dialled.
    Allow(bool),
    /// Refused; the text the script sees.
    Deny(String),
}

/// The BEAM side of a sandbox's network policy: where questions go and
/// where their answers wait.
pub struct PolicyLink {
    owner: LocalPid,
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Verdict>>>,
}

#[rustler::resource_impl]
impl rustler::Resource for PolicyLink {}

impl PolicyLink {
    pub fn new(owner: LocalPid) -> Self {
        PolicyLink { owner, next_id: AtomicU64::new(1), pending: Mutex::new(HashMap::new()) }
    }

    /// Hands an answer to the request waiting for it; `false` when none
    /// waits any more (it timed out, or its command ended).
    pub fn reply(&self, id: u64, verdict: Verdict) -> bool {
        let waiter = self.pending.lock().ok().and_then(|mut p| p.remove(&id));
        match waiter {
            Some(tx) => tx.send(verdict).is_ok(),
            None => false,
        }
    }

    fn forget(&self, id: u64) {
        if let Ok(mut p) = self.pending.lock() {
            p.remove(&id);
        }
    }

    fn send<F>(&self, build: F)
    where
        F: for<'a> FnOnce(rustler::Env<'a>) -> rustler::Term<'a>,
    {
        // Only ever called from a command's own thread, never a scheduler.
        let _ = OwnedEnv::new().send_and_clear(&self.owner, build);
    }
}

/// Transport settings, from the Elixir side's validated options.
#[derive(NifMap)]
pub struct HttpOptions {
    /// Extra trusted roots (PEM documents), added to the system's.
    ca_pems: Vec<String>,
    /// Dial private, loopback and link-local addresses without the policy
    /// naming them.
    allow_private: bool,
    /// How long a request waits for the policy's answer.
    answer_timeout_ms: u64,
    /// Fixed addresses for some host names, used instead of DNS (as
    /// curl's `--resolve`).
    resolve: Vec<(String, String)>,
}

pub struct PolicyTransport {
    link: ResourceArc<PolicyLink>,
    roots: Vec<reqwest::Certificate>,
    allow_private: bool,
    answer_timeout: Duration,
    resolve: HashMap<String, IpAddr>,
}

impl PolicyTransport {
    pub fn new(link: ResourceArc<PolicyLink>, opts: HttpOptions) -> Result<Self, String> {
        install_crypto_provider();
        let mut roots = Vec::new();
        for pem in &opts.ca_pems {
            let certs = reqwest::Certificate::from_pem_bundle(pem.as_bytes())
                .map_err(|e| format!("a CA certificate could not be read: {e}"))?;
            if certs.is_empty() {
                return Err("a CA file holds no certificate".into());
            }
            roots.extend(certs);
        }
        let mut resolve = HashMap::new();
        for (name, ip) in &opts.resolve {
            let ip: IpAddr = ip.parse().map_err(|_| format!("resolve: {ip:?} is not an IP address"))?;
            resolve.insert(name.to_ascii_lowercase(), ip);
        }
        Ok(PolicyTransport {
            link,
            resolve,
            roots,
            allow_private: opts.allow_private,
            answer_timeout: Duration::from_millis(opts.answer_timeout_ms.max(1)),
        })
    }

    async fn ask(&self, id: u64, request: &HttpTransportRequest) -> Verdict {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.link.pending.lock() {
            p.insert(id, tx);
        }
        let method = request.method.as_str();
        let url = request.url.clone();
        let headers = request.headers.clone();
        self.link.send(|env| (tags::condukt_virtual_http(), id, method, url, headers).encode(env));

        let answer = tokio::time::timeout(self.answer_timeout, rx).await;
        self.link.forget(id);
        match answer {
            Ok(Ok(verdict)) => verdict,
            _ => Verdict::Deny(format!(
                "the network policy of this sandbox gave no answer within {} ms; the request to {} was refused",
                self.answer_timeout.as_millis(),
                request.url
            )),
        }
    }

    /// The addresses the request may dial, or why none.
    async fn addresses(&self, host: &str, port: u16, private_ok: bool) -> Result<Vec<SocketAddr>, Result<String, String>> {
        let found: Vec<SocketAddr> = match self.resolve.get(&host.to_ascii_lowercase()) {
            Some(ip) => vec![SocketAddr::new(*ip, port)],
            None => match tokio::net::lookup_host((host, port)).await {
                Ok(found) => found.collect(),
                Err(e) => return Err(Err(format!("upstream_unreachable: cannot resolve {host}: {e}"))),
            },
        };
        if private_ok || self.allow_private {
            return Ok(found);
        }
        let public: Vec<SocketAddr> = found.iter().copied().filter(|a| !is_private(a.ip())).collect();
        match (public.is_empty(), found.first()) {
            (false, _) => Ok(public),
            (true, Some(first)) => Err(Ok(format!("upstream_private_address: {}", first.ip()))),
            (true, None) => Err(Err(format!("upstream_unreachable: {host} has no address"))),
        }
    }
}

/// An allowed request whose outcome the policy process still expects.
/// Exactly one outcome is reported: the one given, or, when the request is
/// dropped half-way (curl's `--max-time`, the command's deadline), a failure.
struct Pending<'a> {
    transport: &'a PolicyTransport,
    id: u64,
    reported: bool,
}

impl Pending<'_> {
    fn done<F>(&mut self, outcome: F)
    where
        F: for<'a> FnOnce(rustler::Env<'a>) -> rustler::Term<'a>,
    {
        self.reported = true;
        let id = self.id;
        self.transport
            .link
            .send(|env| (tags::condukt_virtual_http_done(), id, outcome(env)).encode(env));
    }

    fn failed(&mut self, reason: String, bytes_in: u64, bytes_out: u64) -> HttpTransportError {
        let r = reason.clone();
        self.done(move |env| (tags::failed(), r, bytes_in, bytes_out).encode(env));
        HttpTransportError::Transport(reason)
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.done(|env| {
                (tags::failed(), "upstream_timeout: the request was abandoned before it completed", 0u64, 0u64)
                    .encode(env)
            });
        }
    }
}

#[bashkit::async_trait]
impl HttpTransport for PolicyTransport {
    async fn execute(&self, request: HttpTransportRequest) -> Result<HttpResponse, HttpTransportError> {
        let id = self.link.next_id.fetch_add(1, Ordering::Relaxed);

        // 1. The policy, before anything touches the network.
        let private_ok = match self.ask(id, &request).await {
            Verdict::Allow(private_ok) => private_ok,
            Verdict::Deny(text) => return Err(HttpTransportError::Denied(text)),
        };
        let mut pending = Pending { transport: self, id, reported: false };

        let bytes_out = request.body.as_ref().map_or(0, |b| b.len() as u64);
        let parsed = match url::Url::parse(&request.url) {
            Ok(u) => u,
            Err(e) => return Err(pending.failed(format!("bad_request: {e}"), 0, 0)),
        };
        let (host, port) = match (parsed.host_str(), parsed.port_or_known_default()) {
            (Some(h), Some(p)) => (h.trim_start_matches('[').trim_end_matches(']').to_string(), p),
            _ => return Err(pending.failed("bad_request: the URL names no host".into(), 0, 0)),
        };

        // 2. Where to connect: resolved once, here, and pinned, so the
        // address checked is the address dialled.
        let addrs = match self.addresses(&host, port, private_ok).await {
            Ok(addrs) => addrs,
            Err(Ok(refusal)) => {
                let r = refusal.clone();
                pending.done(move |env| (tags::refused(), r).encode(env));
                return Err(HttpTransportError::Denied(format!(
                    "the request to {host} was refused: {refusal} (private, loopback and link-local addresses \
                     need an allow rule naming the address)"
                )));
            }
            Err(Err(why)) => return Err(pending.failed(why, 0, 0)),
        };

        // 3. The request itself: no redirects (bashkit follows them, one
        // policy question per hop), no proxy, no decompression.
        let mut builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(request.timeout)
            .connect_timeout(request.connect_timeout.unwrap_or(Duration::from_secs(10)).min(request.timeout))
            .user_agent("condukt-virtual")
            .tls_certs_merge(self.roots.iter().cloned());
        if host.parse::<IpAddr>().is_err() {
            builder = builder.resolve_to_addrs(&host, &addrs);
        }
        let client = match builder.build() {
            Ok(c) => c,
            Err(e) => return Err(pending.failed(format!("internal: cannot build the HTTP client: {e}"), 0, 0)),
        };
        let method = match reqwest::Method::from_bytes(request.method.as_str().as_bytes()) {
            Ok(m) => m,
            Err(e) => return Err(pending.failed(format!("bad_request: {e}"), 0, 0)),
        };
        let mut outgoing = client.request(method, parsed);
        for (name, value) in &request.headers {
            outgoing = outgoing.header(name.as_str(), value.as_str());
        }
        if let Some(body) = request.body.clone() {
            outgoing = outgoing.body(body);
        }

        let mut response = match outgoing.send().await {
            Ok(r) => r,
            Err(e) => return Err(pending.failed(upstream_reason(&e), 0, bytes_out)),
        };
        let status = response.status().as_u16();
        let headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
            .collect();

        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > request.max_response_bytes {
                        let read = (body.len() + chunk.len()) as u64;
                        pending.done(move |env| {
                            (tags::failed(), "response_too_large", read, bytes_out).encode(env)
                        });
                        return Err(HttpTransportError::TooLarge(format!(
                            "more than {} bytes",
                            request.max_response_bytes
                        )));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return Err(pending.failed(upstream_reason(&e), body.len() as u64, bytes_out)),
            }
        }

        let bytes_in = body.len() as u64;
        let h = headers.clone();
        pending.done(move |env| (tags::closed(), status, h, bytes_in, bytes_out).encode(env));
        Ok(HttpResponse { status, headers, body })
    }
}

/// The sidecar's failure vocabulary (docs/proxy.md), for the same events.
fn upstream_reason(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    if e.is_timeout() {
        format!("upstream_timeout: {text}")
    } else if text.contains("certificate") || text.contains("tls") || text.contains("TLS") {
        format!("upstream_tls: {text}")
    } else if e.is_connect() {
        format!("upstream_unreachable: {text}")
    } else {
        format!("upstream_reset: {text}")
    }
}

/// Loopback, RFC 1918, CGNAT, link-local (cloud metadata), benchmarking,
/// multicast, unspecified and their IPv6 counterparts: the ranges the
/// sidecar refuses unless the policy names the address.
fn is_private(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => private_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => private_v4(v4),
            None => private_v6(v6),
        },
    }
}

fn private_v4(ip: Ipv4Addr) -> bool {
    let [a, b, ..] = ip.octets();
    ip.is_loopback()
        || ip.is_private()
        || ip.is_link_local()
        || ip.is_unspecified()
        || ip.is_broadcast()
        || ip.is_multicast()
        || a == 0
        || (a == 100 && (64..128).contains(&b))
        || (a == 198 && (b == 18 || b == 19))
        || a >= 240
}

fn private_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || ip.is_unspecified()
        || ip.is_multicast()
        || (first & 0xfe00) == 0xfc00
        || (first & 0xffc0) == 0xfe80
        // IPv4-compatible (::/96), NAT64 and 6to4 forms carry an IPv4 address.
        || ip.segments()[..6] == [0, 0, 0, 0, 0, 0]
        || (ip.segments()[..6] == [0x64, 0xff9b, 0, 0, 0, 0] && private_v4(embedded_v4(ip)))
        || (first == 0x64 && ip.segments()[1] == 0xff9b && ip.segments()[2] == 1)
        || (first == 0x2002 && private_v4(Ipv4Addr::from(((ip.segments()[1] as u32) << 16) | ip.segments()[2] as u32)))
}

fn embedded_v4(ip: Ipv6Addr) -> Ipv4Addr {
    let s = ip.segments();
    Ipv4Addr::from(((s[6] as u32) << 16) | s[7] as u32)
}

fn install_crypto_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // Another provider already installed (bashkit's own) is just as good.
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_ranges() {
        for ip in ["127.0.0.1", "10.1.2.3", "192.168.0.1", "169.254.169.254", "100.64.0.1", "::1", "fe80::1", "fd00::1", "::ffff:10.0.0.1", "64:ff9b::a00:1", "2002:a00:1::"] {
            assert!(is_private(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "93.184.216.34", "2606:4700::1111", "64:ff9b::101:101"] {
            assert!(!is_private(ip.parse().unwrap()), "{ip}");
        }
    }
}
