//! The one path a guest's HTTP request takes out of its sandbox.
//!
//! wasmtime-wasi-http is built without its own sender, so every request a
//! guest makes through `wasi:http/outgoing-handler` reaches [`Egress`], the
//! sandbox's hook, and nothing else. Before anything is sent it checks, in
//! order: that this sandbox may use the network at all (the call's, never a
//! question's, and only when its `is-open-world` answer is true); the method;
//! the URL against the plugin's [`NetworkGrant`]; the Host header against the
//! URL; and the call's request and connection caps. It then resolves the
//! name itself, keeps only the addresses the grant allows (see `network`),
//! connects to one of those and nothing else, speaks TLS with the bundled
//! Mozilla roots, and HTTP/1.1 or HTTP/2 as ALPN decides. A connection stays
//! open for the call's later requests to the same origin (see
//! [`Connection`]). The secrets of the request's origin are added as it
//! leaves; their values are masked in everything that comes back, trailers
//! included. Bodies both ways count against the call's byte caps, as do
//! the head and trailers of each request the guest wrote, and every wait is
//! cut to the call's deadline. Every request counts against the request
//! cap, refused or not.
//!
//! A refusal reaches the guest as `error-code.internal-error` with the
//! reason, and is reported to the call's refusal sink and the host's log.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use http::{HeaderName, HeaderValue, Method, Request, Response, header};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use wasmtime_wasi_http::p2::bindings::http::types::ErrorCode;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use crate::limits::{LimitKind, Limits, human_bytes};
use crate::load::network::{Host, NetworkGrant, Rule, Scheme, Target, parse_port};
use crate::tool::{NetworkRefusal, RefusalSink};

/// The methods a guest may use. `CONNECT` would open a tunnel past every
/// check, and `TRACE` echoes the request back, secrets included.
const METHODS: &[Method] =
    &[Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE, Method::OPTIONS];

/// What the guest gets in place of a secret a server echoed back: the same
/// number of bytes, so lengths the server declared still hold.
const MASK: u8 = b'*';

/// How long before the call's deadline every network wait ends, so that the
/// guest hears why and can still report it within its deadline.
pub const DEADLINE_RESERVE: Duration = Duration::from_millis(250);

type SendFuture = Box<dyn Future<Output = Result<(Response<WasiBody>, IoFuture), HttpError>> + Send>;
type IoFuture = Box<dyn Future<Output = Result<(), HttpError>> + Send>;

/// What one call has used of its network limits, shared by its requests.
struct Usage {
    requests: AtomicUsize,
    sent: AtomicUsize,
    received: AtomicUsize,
    /// One permit per connection open, of `network_connections`.
    connections: Arc<Semaphore>,
    /// The call's connections, open until the call ends (an HTTP/1.1 one
    /// is out of the list while a request is put on it).
    open: Mutex<Vec<Connection>>,
}

impl Usage {
    fn open(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        // Every change to the list is made whole under the lock.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The list, with the connections the server has closed dropped, and
    /// their places under `network_connections` given back.
    fn live(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        let mut open = self.open();
        open.retain(|connection| !connection.sender.is_closed());
        open
    }

    /// How a request to `target` goes, decided under one taking of the
    /// list: over a connection the call has open that may take it now (an
    /// idle HTTP/1.1 one, taken out until the request is sent, or an
    /// HTTP/2 one, which carries many at once), else over a new one, in a
    /// place under `network_connections` ([`Usage::permit_in`]); `None`
    /// when no place can be had.
    fn route(&self, target: &Target) -> Option<Route> {
        let mut open = self.live();
        let Some(index) =
            open.iter().position(|connection| connection.target == *target && connection.is_idle())
        else {
            return self.permit_in(&mut open).map(Route::New);
        };
        Some(Route::Reuse(match &open[index].sender {
            Sender::Http2(sender) => Reuse::Shared(sender.clone(), open[index].busy.clone()),
            Sender::Http1(_) => Reuse::Taken(open.remove(index)),
        }))
    }

    /// A place for one more connection under `network_connections`: see
    /// [`Usage::permit_in`].
    fn connection_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permit_in(&mut self.live())
    }

    /// A place for one more connection under `network_connections`, the
    /// call's connections still open being `open`: when every place is
    /// taken, the unused one that was opened first is closed to make one.
    fn permit_in(&self, open: &mut Vec<Connection>) -> Option<OwnedSemaphorePermit> {
        if let Ok(permit) = self.connections.clone().try_acquire_owned() {
            return Some(permit);
        }
        let idle = open.iter().position(Connection::is_unused)?;
        // Its place is given back as it is dropped.
        drop(open.remove(idle));
        self.connections.clone().try_acquire_owned().ok()
    }
}

/// A connection a request may go over, of those the call has open.
enum Reuse {
    /// An HTTP/1.1 connection, out of the list until the request is sent.
    Taken(Connection),
    /// An HTTP/2 connection's sender, and what holds the connection busy.
    Shared(hyper::client::conn::http2::SendRequest<Counted<WasiBody>>, Arc<()>),
}

/// The response to a request sent over a [`Connection`].
type ResponseFuture = Pin<Box<dyn Future<Output = hyper::Result<Response<hyper::body::Incoming>>> + Send>>;

/// One connection a call opened, to `target`, kept open between its
/// requests as a browser keeps one: a request to the same origin while the
/// connection is idle goes over it, where a new one would cost a handshake
/// (TCP, and TLS for `https`). Its address was judged when it was made. A
/// task of its own moves its bytes; dropping the connection, as the call
/// ends, ends that task and gives its place under `network_connections`
/// back.
struct Connection {
    target: Target,
    sender: Sender,
    /// Held by each response whose body is still being read.
    busy: Arc<()>,
    _permit: OwnedSemaphorePermit,
    driver: tokio::task::AbortHandle,
}

impl Connection {
    /// Whether a request may go over it now: HTTP/2 carries many at once;
    /// an HTTP/1.1 connection, once no response of it is still to come or
    /// being read.
    fn is_idle(&self) -> bool {
        matches!(self.sender, Sender::Http2(_)) || self.is_unused()
    }

    /// Whether nothing goes over it now, so that closing it loses nothing.
    fn is_unused(&self) -> bool {
        Arc::strong_count(&self.busy) == 1
    }

    fn send(&mut self, request: Request<Counted<WasiBody>>) -> (ResponseFuture, Arc<()>) {
        (self.sender.send(request), self.busy.clone())
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// How a [`Connection`]'s requests are sent.
enum Sender {
    Http1(hyper::client::conn::http1::SendRequest<Counted<WasiBody>>),
    Http2(hyper::client::conn::http2::SendRequest<Counted<WasiBody>>),
}

impl Sender {
    /// Wait until the connection takes another request: an HTTP/1.1 one
    /// once it has read the last response whole.
    async fn ready(&mut self) -> hyper::Result<()> {
        match self {
            Sender::Http1(sender) => sender.ready().await,
            Sender::Http2(sender) => sender.ready().await,
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Sender::Http1(sender) => sender.is_closed(),
            Sender::Http2(sender) => sender.is_closed(),
        }
    }

    /// Send `request`, in the form its protocol wants.
    fn send(&mut self, mut request: Request<Counted<WasiBody>>) -> ResponseFuture {
        match self {
            Sender::Http1(sender) => {
                // The request line carries the path (made absolute by
                // `make_path_absolute`); the authority went in Host.
                *request.uri_mut() = request
                    .uri()
                    .path_and_query()
                    .map_or_else(|| http::Uri::from_static("/"), |path| http::Uri::from(path.clone()));
                Box::pin(sender.send_request(request))
            }
            Sender::Http2(sender) => {
                // HTTP/2 carries the authority as `:authority`, from the URI.
                request.headers_mut().remove(header::HOST);
                Box::pin(sender.send_request(request))
            }
        }
    }
}

/// One sandbox's network: closed unless [`Egress::open`] opened it.
pub(crate) struct Egress {
    grant: Arc<NetworkGrant>,
    limits: Limits,
    plugin: Arc<str>,
    /// Why requests are refused now, or `None` when they may go.
    closed: Option<&'static str>,
    /// The call's deadline: no wait outlasts it.
    pub(crate) deadline: Instant,
    /// Made with the first request: most sandboxes never send one.
    usage: OnceLock<Arc<Usage>>,
    refused: Option<RefusalSink>,
}

/// Why a sandbox that was never opened refuses every request.
const QUESTION: &str = "a tool's questions never get the network; only its call may, with a network grant";

impl Egress {
    /// A closed network for a sandbox of `plugin`, whose grant is `grant`.
    pub(crate) fn new(
        grant: Arc<NetworkGrant>,
        limits: &Limits,
        plugin: Arc<str>,
        deadline: Instant,
    ) -> Self {
        Egress {
            usage: OnceLock::new(),
            grant,
            limits: *limits,
            plugin,
            closed: Some(QUESTION),
            deadline,
            refused: None,
        }
    }

    /// What this sandbox's requests have used of the limits.
    fn usage(&self) -> &Arc<Usage> {
        self.usage.get_or_init(|| {
            Arc::new(Usage {
                requests: AtomicUsize::new(0),
                sent: AtomicUsize::new(0),
                received: AtomicUsize::new(0),
                connections: Arc::new(Semaphore::new(self.limits.network_connections)),
                open: Mutex::new(Vec::new()),
            })
        })
    }

    /// Open the network for the call, when the plugin has a grant and the
    /// call claimed to reach the world outside; else say why it stays shut.
    pub(crate) fn open(&mut self, open_world: bool) {
        self.closed = if self.grant.is_empty() {
            Some("the plugin has no network grant")
        } else if !open_world {
            Some("the call answered that it is not open-world (is-open-world), so it gets no network")
        } else {
            None
        };
    }

    /// Send refusals to `sink` as well as to the log.
    pub(crate) fn report_refusals_to(&mut self, sink: RefusalSink) {
        self.refused = Some(sink);
    }

    /// The masks of every secret of the plugin, for what leaves the sandbox.
    pub(crate) fn scrubber(&self) -> Scrubber {
        Scrubber::new(&self.grant)
    }

    /// Check `request` (to `url`), the `attempt`-th the sandbox sent (from
    /// 0), against
    /// the request cap, whether the network is open, the policy, and the
    /// bytes-sent cap, which its URL and headers count against; on refusal,
    /// the reason.
    fn admit(&self, request: &Request<WasiBody>, url: &str, attempt: usize) -> Result<Target, String> {
        if attempt >= self.limits.network_requests {
            return Err(limit_hit(&self.limits, LimitKind::NetworkRequests));
        }
        if let Some(reason) = self.closed {
            return Err(reason.to_owned());
        }
        let (target, rule) = check(&self.grant, request)?;
        tracing::trace!(plugin = &*self.plugin, %rule, "network request admitted");
        let head = head_len(request, url);
        let sent = self.usage().sent.fetch_add(head, Ordering::Relaxed) + head;
        if sent > self.limits.network_sent {
            return Err(limit_hit(&self.limits, LimitKind::NetworkSent));
        }
        Ok(target)
    }

    /// The connection a request to `target` goes over: one the call has
    /// open that may take it, or a new one, whose place is taken now; on
    /// refusal, the reason. Decided as the guest sends, so that requests
    /// take places in the order they were sent.
    fn route(&self, target: &Target) -> Result<Route, String> {
        self.usage().route(target).ok_or_else(|| limit_hit(&self.limits, LimitKind::NetworkConnections))
    }
}

impl Drop for Egress {
    /// The sandbox is gone: so are its connections, even one whose task
    /// still holds a request body (which would keep the call's usage, and so
    /// the connection, alive).
    fn drop(&mut self) {
        if let Some(usage) = self.usage.get() {
            usage.open().clear();
        }
    }
}

/// How an admitted request goes: over a connection the call has open, or
/// over a new one, which has its place under `network_connections`.
enum Route {
    Reuse(Reuse),
    New(OwnedSemaphorePermit),
}

/// The guest-visible error of a request refused for `reason`.
fn refusal_error(reason: String) -> HttpError {
    HttpError::InternalError(Some(reason))
}

fn limit_hit(limits: &Limits, kind: LimitKind) -> String {
    format!("{kind} of {} reached", limits.value_of(kind))
}

/// Report a refusal to the log and the call's sink.
fn report(plugin: &str, sink: Option<&RefusalSink>, method: &Method, url: &str, reason: &str) {
    tracing::warn!(plugin, %method, url, "network request refused: {reason}");
    if let Some(sink) = sink {
        sink(&NetworkRefusal { method: method.to_string(), url: url.to_owned(), reason: reason.to_owned() });
    }
}

/// The policy's judgement of `request` before any name is resolved: its
/// method, its target, and the grant's rule that allows it; else why not.
pub(crate) fn check<'a, B>(
    grant: &'a NetworkGrant,
    request: &Request<B>,
) -> Result<(Target, &'a Rule), String> {
    if !METHODS.contains(request.method()) {
        return Err(format!("the {} method is not allowed", request.method()));
    }
    let target = target_of(request)?;
    let rule = grant.allows(&target)?;
    Ok((target, rule))
}

/// The target of a request, from its URL, checked against its Host header.
fn target_of<B>(request: &Request<B>) -> Result<Target, String> {
    let uri = request.uri();
    let scheme = match uri.scheme_str().and_then(Scheme::parse) {
        Some(scheme) => scheme,
        None => return Err(format!("the scheme of {uri} is not http or https")),
    };
    let Some(authority) = uri.authority() else { return Err(format!("{uri} has no host")) };
    if authority.as_str().contains('@') {
        return Err(format!("{uri} carries user info, which keel does not send"));
    }
    let Some(host) = Host::parse(authority.host()) else {
        return Err(format!("the host of {uri} is not a name or an address"));
    };
    // The authority's port, read here: `http` reads a port that is no
    // number (`:99999`, `:0x50`, `:`) as none, which would be the scheme's.
    let port = match &authority.as_str()[authority.host().len()..] {
        "" => scheme.default_port(),
        port => match port.strip_prefix(':').and_then(parse_port) {
            Some(port) => port,
            None => return Err(format!("the port of {uri} is not a number from 1 to 65535")),
        },
    };
    let mut hosts = request.headers().get_all(header::HOST).iter();
    if let Some(value) = hosts.next()
        && (hosts.next().is_some() || !value.as_bytes().eq_ignore_ascii_case(authority.as_str().as_bytes()))
    {
        return Err(format!("its Host header disagrees with the URL's authority {authority}"));
    }
    Ok(Target { scheme, host, port })
}

/// Make the path of `uri` begin with `/`: `wasi:http` takes a path and
/// query such as `?q=1`, which HTTP/1.1's request line and HTTP/2's `:path`
/// must carry as `/?q=1`. A path that begins with `/` is left as it is.
fn make_path_absolute(uri: &mut http::Uri) -> Result<(), String> {
    let Some(path) = uri.path_and_query().filter(|path| !path.as_str().starts_with('/')) else {
        return Ok(());
    };
    let absolute = format!("/{}", path.as_str())
        .parse()
        .map_err(|error| format!("the path of {uri} is not valid: {error}"))?;
    let named = uri.to_string();
    let mut parts = std::mem::take(uri).into_parts();
    parts.path_and_query = Some(absolute);
    *uri = http::Uri::from_parts(parts).map_err(|error| format!("{named} is not a valid URL: {error}"))?;
    Ok(())
}

/// The bytes of a request's head the guest chose, as they count against
/// the bytes-sent cap: its method, its URL (`url`, as written) and its
/// headers ([`fields_len`]), with the separators HTTP/1.1 writes around
/// them.
fn head_len<B>(request: &Request<B>, url: &str) -> usize {
    request.method().as_str().len() + url.len() + 12 + fields_len(request.headers())
}

/// The bytes of a request's headers or trailers, as they count against the
/// bytes-sent cap: each name and value, with the separators HTTP/1.1
/// writes around them.
fn fields_len(fields: &http::HeaderMap) -> usize {
    fields.iter().map(|(name, value)| name.as_str().len() + value.len() + 4).sum()
}

impl WasiHttpHooks for Egress {
    /// A failed handshake is the tool's to report, with the reason (a
    /// certificate its roots do not trust, or not for the name asked),
    /// where `tls-protocol-error` alone says nothing of it.
    fn p2_error_from_tls(&mut self, error: &std::io::Error) -> ErrorCode {
        tracing::debug!(plugin = &*self.plugin, "a TLS handshake failed: {error}");
        ErrorCode::InternalError(Some(format!("the TLS handshake failed: {error}")))
    }

    /// As wasmtime answers them, logged as what a tool's server did, not as
    /// the host's warning.
    fn p2_error_from_hyper(&mut self, error: &hyper::Error) -> ErrorCode {
        tracing::debug!(plugin = &*self.plugin, "an HTTP exchange failed: {error}");
        ErrorCode::HttpProtocolError
    }

    /// As wasmtime answers them, logged as what a tool's server did, not as
    /// the host's warning.
    fn p2_error_from_connect(&mut self, error: &std::io::Error) -> ErrorCode {
        tracing::debug!(plugin = &*self.plugin, "a connection failed: {error}");
        ErrorCode::ConnectionRefused
    }

    fn send_request(
        &mut self,
        mut request: Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> SendFuture {
        let url = request.uri().to_string();
        let method = request.method().clone();
        // Every request counts, refused or not. Past the cap a guest looping
        // on requests is refused without a report each, so that it floods
        // neither the log nor the call's events.
        let attempt = self.usage().requests.fetch_add(1, Ordering::Relaxed);
        let reported = attempt <= self.limits.network_requests;
        let refuse = |reason: String| -> SendFuture {
            if reported {
                report(&self.plugin, self.refused.as_ref(), &method, &url, &reason);
            }
            Box::new(async move { Err(refusal_error(reason)) })
        };
        let target = match self.admit(&request, &url, attempt).and_then(|target| {
            make_path_absolute(request.uri_mut())?;
            Ok(target)
        }) {
            Ok(target) => target,
            Err(reason) => return refuse(reason),
        };
        let headers = request.headers_mut();
        let mut secrets = false;
        for secret in self.grant.secrets_for(&target) {
            headers.insert(secret.header().clone(), secret.value().clone());
            secrets = true;
        }
        if secrets {
            // A compressed echo would slip past the masks.
            headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
        }
        let request = request.map(|body| Counted {
            inner: body,
            usage: self.usage().clone(),
            cap: self.limits.network_sent,
            direction: Direction::Sent,
        });
        let route = match self.route(&target) {
            Ok(route) => route,
            Err(reason) => return refuse(reason),
        };
        let trip = Trip {
            grant: self.grant.clone(),
            limits: self.limits,
            usage: self.usage().clone(),
            deadline: self.deadline,
            plugin: self.plugin.clone(),
            refused: self.refused.clone(),
            scrubber: Scrubber::new(&self.grant),
            method,
            url,
            target,
        };
        Box::new(trip.send(request, route))
    }
}

/// One admitted request, on its way.
struct Trip {
    grant: Arc<NetworkGrant>,
    limits: Limits,
    usage: Arc<Usage>,
    deadline: Instant,
    plugin: Arc<str>,
    refused: Option<RefusalSink>,
    scrubber: Scrubber,
    method: Method,
    url: String,
    target: Target,
}

/// A TCP stream that has the kernel acknowledge what it received before
/// it waits for more: each time a read would wait after something came in
/// or went out, it sets `TCP_QUICKACK`, which sends an acknowledgement the
/// kernel put off at once. A connection that goes back and forth falls
/// into Linux's delayed-acknowledgement mode, and a server with Nagle's
/// algorithm on holds back each piece it writes apart (a response's head
/// and body, a body in TLS records of a write each) until the one before
/// is acknowledged: 40 ms a piece. A held piece costs only a reader that
/// waits for it, and a reader about to wait has read all that came: so one
/// system call a wait, none a read. Set after a write (a request, a TLS
/// handshake's flight), it also takes the connection out of that mode
/// before the response arrives.
struct QuickAck {
    inner: TcpStream,
    /// Whether anything was read or written since the last wait.
    moved: bool,
}

impl tokio::io::AsyncRead for QuickAck {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let Poll::Ready(read) = Pin::new(&mut self.inner).poll_read(cx, buf) else {
            if std::mem::take(&mut self.moved) {
                #[cfg(target_os = "linux")]
                let _ = socket2::SockRef::from(&self.inner).set_tcp_quickack(true);
            }
            return Poll::Pending;
        };
        self.moved |= buf.filled().len() > before;
        Poll::Ready(read)
    }
}

impl tokio::io::AsyncWrite for QuickAck {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write(cx, data));
        self.moved |= matches!(written, Ok(1..));
        Poll::Ready(written)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let written = ready!(Pin::new(&mut self.inner).poll_write_vectored(cx, data));
        self.moved |= matches!(written, Ok(1..));
        Poll::Ready(written)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A stream the request may go over: TCP, or TLS over it.
trait Stream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Stream for T {}

impl Trip {
    /// How long a wait of at most `limit` may last: never past the
    /// deadline, less [`DEADLINE_RESERVE`].
    fn wait(&self, limit: Duration) -> Duration {
        limit.min(until_reserve(self.deadline))
    }

    fn refuse(&self, reason: String) -> HttpError {
        report(&self.plugin, self.refused.as_ref(), &self.method, &self.url, &reason);
        refusal_error(reason)
    }

    async fn send(
        self,
        request: Request<Counted<WasiBody>>,
        route: Route,
    ) -> Result<(Response<WasiBody>, IoFuture), HttpError> {
        let response_limit = self.wait(self.limits.network_response);
        let (response, busy) = match route {
            Route::Reuse(reuse) => self.reuse(request, reuse, response_limit).await?,
            Route::New(permit) => self.open(request, permit).await?,
        };
        let response = tokio::time::timeout(response_limit, response).await;
        let response = self.answered(response, response_limit)?;
        let (mut parts, body) = response.into_parts();
        self.scrubber.mask_headers(&mut parts.headers);
        let stall = self.limits.network_response;
        let received = Received {
            inner: Counted {
                inner: body.map_err(HttpError::from),
                usage: self.usage.clone(),
                cap: self.limits.network_received,
                direction: Direction::Received,
            },
            stall,
            deadline: self.deadline,
            timer: None,
            scrub: self.scrubber.stream(),
            ended: false,
            trailers: None,
            busy: Some(busy),
        };
        // The connection's own task moves the body: nothing more to drive.
        let io: IoFuture = Box::new(async { Ok(()) });
        Ok((Response::from_parts(parts, received.boxed_unsync()), io))
    }

    /// Send `request` over a connection the call has open, once it takes
    /// it (waiting at most `limit`); should it have closed, over a new one.
    async fn reuse(
        &self,
        request: Request<Counted<WasiBody>>,
        reuse: Reuse,
        limit: Duration,
    ) -> Result<(ResponseFuture, Arc<()>), HttpError> {
        match reuse {
            Reuse::Shared(sender, busy) => {
                let mut sender = Sender::Http2(sender);
                if !self.ready_within(&mut sender, limit).await? {
                    return self.open_again(request).await;
                }
                Ok((sender.send(request), busy))
            }
            Reuse::Taken(mut connection) => {
                if !self.ready_within(&mut connection.sender, limit).await? {
                    drop(connection);
                    return self.open_again(request).await;
                }
                let sent = connection.send(request);
                self.usage.open().push(connection);
                Ok(sent)
            }
        }
    }

    /// Wait at most `limit` for `sender`'s connection to take a request:
    /// `false` when it closed instead (a server may close an idle
    /// connection whenever it likes).
    async fn ready_within(&self, sender: &mut Sender, limit: Duration) -> Result<bool, HttpError> {
        match tokio::time::timeout(limit, sender.ready()).await {
            Ok(ready) => Ok(ready.is_ok()),
            Err(_) => Err(self.timeout(LimitKind::NetworkResponse, limit)),
        }
    }

    /// Send `request` over a new connection in place of one that closed
    /// before it could go.
    async fn open_again(
        &self,
        request: Request<Counted<WasiBody>>,
    ) -> Result<(ResponseFuture, Arc<()>), HttpError> {
        match self.usage.connection_permit() {
            Some(permit) => self.open(request, permit).await,
            None => Err(self.refuse(limit_hit(&self.limits, LimitKind::NetworkConnections))),
        }
    }

    /// Connect to the target, in the place `permit` holds, send `request`
    /// over the new connection and keep the connection for the call's later
    /// requests: the response to come, and what holds the connection busy.
    async fn open(
        &self,
        request: Request<Counted<WasiBody>>,
        permit: OwnedSemaphorePermit,
    ) -> Result<(ResponseFuture, Arc<()>), HttpError> {
        let connect_limit = self.wait(self.limits.network_connect);
        let connected = tokio::time::timeout(connect_limit, self.connect()).await;
        let (stream, h2) = match connected {
            Ok(connected) => connected?,
            Err(_) => return Err(self.timeout(LimitKind::NetworkConnect, connect_limit)),
        };
        let (sender, driver) = if h2 {
            let (sender, connection) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                    .await
                    .map_err(HttpError::from)?;
            (Sender::Http2(sender), tokio::spawn(drive(connection)))
        } else {
            let (sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(HttpError::from)?;
            (Sender::Http1(sender), tokio::spawn(drive(connection)))
        };
        let mut connection = Connection {
            target: self.target.clone(),
            sender,
            busy: Arc::new(()),
            _permit: permit,
            driver: driver.abort_handle(),
        };
        let sent = connection.send(request);
        self.usage.open().push(connection);
        Ok(sent)
    }

    /// A response, or the error of one that failed or took too long.
    fn answered(
        &self,
        response: Result<hyper::Result<Response<hyper::body::Incoming>>, tokio::time::error::Elapsed>,
        limit: Duration,
    ) -> Result<Response<hyper::body::Incoming>, HttpError> {
        match response {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(body_error(error).unwrap_or_else(HttpError::from)),
            Err(_) => Err(self.timeout(LimitKind::NetworkResponse, limit)),
        }
    }

    /// The error of a wait cut at `waited`: the limit's, or the deadline's
    /// when that came first.
    fn timeout(&self, kind: LimitKind, waited: Duration) -> HttpError {
        let reason = if waited < self.limits_of(kind) {
            format!("{} gave up: the call's deadline is near", self.url)
        } else {
            format!("{} gave up: {kind} of {} reached", self.url, self.limits.value_of(kind))
        };
        tracing::warn!(plugin = &*self.plugin, url = %self.url, "{reason}");
        refusal_error(reason)
    }

    fn limits_of(&self, kind: LimitKind) -> Duration {
        match kind {
            LimitKind::NetworkConnect => self.limits.network_connect,
            _ => self.limits.network_response,
        }
    }

    /// Resolve, judge every address, and connect to an allowed one: the
    /// stream, and whether it speaks HTTP/2.
    async fn connect(&self) -> Result<(Box<dyn Stream>, bool), HttpError> {
        let port = self.target.port;
        let addresses: Vec<IpAddr> = match &self.target.host {
            Host::Addr(addr) => vec![*addr],
            Host::Name(name) => match tokio::net::lookup_host((name.as_str(), port)).await {
                Ok(found) => found.map(|addr| addr.ip()).collect(),
                Err(error) => {
                    return Err(HttpError::DnsError {
                        rcode: Some(format!("{name}: {error}")),
                        info_code: None,
                    });
                }
            },
        };
        let mut allowed = Vec::new();
        let mut refused = None;
        for addr in addresses {
            match self.grant.allows_address(&self.target, addr) {
                Ok(()) => allowed.push(addr),
                Err(reason) => refused = refused.or(Some(reason)),
            }
        }
        if allowed.is_empty() {
            let reason = refused.unwrap_or_else(|| format!("{} resolves to no address", self.target.host));
            return Err(self.refuse(reason));
        }
        let mut last_error = None;
        let mut tcp = None;
        for addr in allowed {
            match TcpStream::connect(SocketAddr::new(addr, port)).await {
                Ok(stream) => {
                    tcp = Some(stream);
                    break;
                }
                Err(error) => last_error = Some(error),
            }
        }
        let Some(tcp) = tcp else {
            return Err(HttpError::Connect(last_error.expect("an address was tried")));
        };
        let _ = tcp.set_nodelay(true);
        let tcp = QuickAck { inner: tcp, moved: false };
        if self.target.scheme == Scheme::Http {
            return Ok((Box::new(tcp), false));
        }
        let server_name = match &self.target.host {
            Host::Addr(addr) => rustls::pki_types::ServerName::IpAddress((*addr).into()),
            Host::Name(name) => rustls::pki_types::ServerName::try_from(name.clone())
                .map_err(|_| HttpError::InternalError(Some(format!("{name} is no TLS server name"))))?,
        };
        let tls = tokio_rustls::TlsConnector::from(self.grant.tls().config())
            .connect(server_name, tcp)
            .await
            .map_err(HttpError::Tls)?;
        let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
        Ok((Box::new(tls), h2))
    }
}

/// Move a connection's bytes until it ends: the sender is dropped once it
/// is idle, or it fails (the request or body in flight then fails too, and
/// says how).
async fn drive<C: Future<Output = hyper::Result<()>>>(connection: C) {
    if let Err(error) = connection.await {
        tracing::debug!("a network connection ended: {error}");
    }
}

/// A hyper error whose source is one of keel's own body errors (a byte cap
/// hit while sending): that error, which names the limit.
fn body_error(error: hyper::Error) -> Result<HttpError, hyper::Error> {
    use std::error::Error as _;
    let reason =
        error.source().and_then(|source| source.downcast_ref::<HttpError>()).and_then(|inner| match inner {
            HttpError::InternalError(reason) => reason.clone(),
            _ => None,
        });
    match reason {
        Some(reason) => Ok(HttpError::InternalError(Some(reason))),
        None => Err(error),
    }
}

/// The time from now to [`DEADLINE_RESERVE`] before `deadline`.
fn until_reserve(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).saturating_sub(DEADLINE_RESERVE)
}

#[derive(Clone, Copy)]
enum Direction {
    Sent,
    Received,
}

/// A body whose data counts against one of the call's byte caps, and
/// whose trailers do too when the guest sends them (a server's are held to
/// hyper's bounds on a head, as its head is).
struct Counted<B> {
    inner: B,
    usage: Arc<Usage>,
    cap: usize,
    direction: Direction,
}

impl<B: Body<Data = Bytes, Error = HttpError> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let len = match &frame {
            Some(Ok(frame)) => match (frame.data_ref(), self.direction) {
                (Some(data), _) => Some(data.len()),
                (None, Direction::Sent) => frame.trailers_ref().map(fields_len),
                (None, Direction::Received) => None,
            },
            _ => None,
        };
        if let Some(len) = len {
            let (counter, kind) = match self.direction {
                Direction::Sent => (&self.usage.sent, LimitKind::NetworkSent),
                Direction::Received => (&self.usage.received, LimitKind::NetworkReceived),
            };
            let total = counter.fetch_add(len, Ordering::Relaxed) + len;
            if total > self.cap {
                let reason = format!("{kind} of {} reached", human_bytes(self.cap));
                return Poll::Ready(Some(Err(refusal_error(reason))));
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body as the guest reads it: counted, given up when it stalls
/// past the response limit or the deadline, and with secrets masked.
struct Received<B> {
    inner: Counted<B>,
    stall: Duration,
    deadline: Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    scrub: Option<ScrubStream>,
    ended: bool,
    /// Trailers that wait for the body's held-back end to go first.
    trailers: Option<Frame<Bytes>>,
    /// Holds the connection busy until the body has been read to its end
    /// (or dropped).
    busy: Option<Arc<()>>,
}

impl<B: Body<Data = Bytes, Error = HttpError> + Unpin> Body for Received<B> {
    type Data = Bytes;
    type Error = HttpError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpError>>> {
        let this = &mut *self;
        loop {
            if this.ended {
                let rest = this.scrub.as_mut().and_then(ScrubStream::finish).map(Frame::data);
                return Poll::Ready(rest.or_else(|| this.trailers.take()).map(Ok));
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(frame) => {
                    this.timer = None;
                    match frame {
                        None => {
                            this.ended = true;
                            this.busy = None;
                        }
                        Some(Ok(frame)) => match (&mut this.scrub, frame.into_data()) {
                            (Some(scrub), Ok(data)) => {
                                if let Some(out) = scrub.push(&data) {
                                    return Poll::Ready(Some(Ok(Frame::data(out))));
                                }
                            }
                            (None, Ok(data)) => return Poll::Ready(Some(Ok(Frame::data(data)))),
                            (scrub, Err(frame)) => {
                                // Trailers end the body, masked as its head
                                // is: what is held back goes first.
                                let frame = match (scrub.as_ref(), frame.into_trailers()) {
                                    (Some(scrub), Ok(mut trailers)) => {
                                        scrub.scrubber.mask_headers(&mut trailers);
                                        Frame::trailers(trailers)
                                    }
                                    (_, Ok(trailers)) => Frame::trailers(trailers),
                                    (_, Err(frame)) => frame,
                                };
                                this.ended = true;
                                this.busy = None;
                                this.trailers = Some(frame);
                            }
                        },
                        Some(Err(error)) => return Poll::Ready(Some(Err(error))),
                    }
                }
                Poll::Pending => {
                    let (stall, deadline) = (this.stall, this.deadline);
                    let cut = until_reserve(deadline) < stall;
                    let timer = this.timer.get_or_insert_with(|| {
                        let until = Instant::now() + stall.min(until_reserve(deadline));
                        Box::pin(tokio::time::sleep_until(until.into()))
                    });
                    ready!(timer.as_mut().poll(cx));
                    let reason = if cut {
                        "the response body stalled, and the call's deadline is near".to_owned()
                    } else {
                        format!(
                            "the response body stalled: {} of {stall:?} reached",
                            LimitKind::NetworkResponse
                        )
                    };
                    this.ended = true;
                    this.scrub = None;
                    return Poll::Ready(Some(Err(refusal_error(reason))));
                }
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The secret values of one plugin, masked wherever they would reach the
/// guest or leave the sandbox.
#[derive(Clone, Default)]
pub(crate) struct Scrubber {
    hidden: Arc<[Vec<u8>]>,
}

impl Scrubber {
    fn new(grant: &NetworkGrant) -> Self {
        Scrubber { hidden: grant.hidden().clone() }
    }

    /// Whether there is anything to mask.
    pub(crate) fn is_active(&self) -> bool {
        !self.hidden.is_empty()
    }

    /// `bytes` with every secret masked, or `None` when none is in it.
    pub(crate) fn masked(&self, bytes: &[u8]) -> Option<Vec<u8>> {
        self.masked_as(bytes, Case::Kept)
    }

    /// [`Scrubber::masked`], a secret matched as it is, or in any case.
    fn masked_as(&self, bytes: &[u8], case: Case) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        for piece in self.hidden.iter() {
            let current = out.as_deref().unwrap_or(bytes);
            let mut at = 0;
            let mut found = Vec::new();
            while let Some(offset) = find(&current[at..], piece, case) {
                found.push(at + offset);
                at += offset + piece.len();
            }
            if !found.is_empty() {
                let mut owned = current.to_vec();
                for start in found {
                    owned[start..start + piece.len()].fill(MASK);
                }
                out = Some(owned);
            }
        }
        out
    }

    /// Every secret in the names and values of `headers` masked, in place.
    /// A name arrives lowercase whatever case the server wrote it in, so a
    /// secret is found in it in any case; `*` is a character a name may
    /// hold, and a header renamed so keeps its place and values.
    fn mask_headers(&self, headers: &mut http::HeaderMap) {
        if !self.is_active() {
            return;
        }
        let named = |name: &HeaderName| self.masked_as(name.as_str().as_bytes(), Case::Any);
        if headers.keys().any(|name| named(name).is_some()) {
            let mut name = None;
            for (next, value) in std::mem::take(headers) {
                // `None` is another value of the header before.
                if let Some(next) = next {
                    name = Some(match named(&next) {
                        Some(masked) => {
                            HeaderName::from_bytes(&masked).expect("masking keeps a header name valid")
                        }
                        None => next,
                    });
                }
                headers.append(name.clone().expect("a header map begins with a name"), value);
            }
        }
        for value in headers.values_mut() {
            if let Some(masked) = self.masked(value.as_bytes()) {
                *value = HeaderValue::from_bytes(&masked).expect("masking keeps a header value valid");
            }
        }
    }

    /// `text` with every secret masked, in place.
    pub(crate) fn scrub(&self, text: &mut String) {
        if let Some(masked) = self.masked(text.as_bytes()) {
            // A mask replaces whole byte strings that were valid UTF-8 by
            // ASCII; when a secret ends inside a character, lossy keeps it text.
            *text = String::from_utf8(masked)
                .unwrap_or_else(|error| String::from_utf8_lossy(error.as_bytes()).into_owned());
        }
    }

    /// `text` cut to at most `max` bytes, at a character boundary, with
    /// every secret masked. The mask comes first, so a secret the cut runs
    /// through is masked whole, not left with its start in the clear; and
    /// only what a kept byte's secret could reach is searched, the first
    /// `max` bytes and [`Scrubber::overlap`] more, so a huge text costs no
    /// more than one of `max` bytes.
    pub(crate) fn scrub_cut(&self, text: &mut String, max: usize) {
        if text.len() > max {
            text.truncate(text.ceil_char_boundary(max + self.overlap()));
            self.scrub(text);
            text.truncate(text.floor_char_boundary(max));
        } else {
            self.scrub(text);
        }
    }

    /// How far past a cut a secret that begins before it can reach: the
    /// longest secret's length, less one.
    pub(crate) fn overlap(&self) -> usize {
        self.hidden.first().map_or(0, |longest| longest.len() - 1)
    }

    fn stream(&self) -> Option<ScrubStream> {
        let longest = self.hidden.first()?.len();
        Some(ScrubStream { scrubber: self.clone(), held: BytesMut::new(), keep: longest - 1 })
    }
}

/// How a secret is matched.
#[derive(Clone, Copy)]
enum Case {
    /// Byte for byte.
    Kept,
    /// In any ASCII case.
    Any,
}

fn find(haystack: &[u8], needle: &[u8], case: Case) -> Option<usize> {
    if needle.is_empty() || haystack.len() < needle.len() {
        return None;
    }
    let mut windows = haystack.windows(needle.len());
    match case {
        Case::Kept => windows.position(|window| window == needle),
        Case::Any => windows.position(|window| window.eq_ignore_ascii_case(needle)),
    }
}

/// Masks secrets in a body that arrives in chunks: the last `keep` bytes
/// are held back until the next chunk, so a secret split across two is
/// still whole when it is looked for.
struct ScrubStream {
    scrubber: Scrubber,
    held: BytesMut,
    keep: usize,
}

impl ScrubStream {
    /// Take a chunk; what can be released safely, if anything.
    fn push(&mut self, data: &[u8]) -> Option<Bytes> {
        self.held.extend_from_slice(data);
        if let Some(masked) = self.scrubber.masked(&self.held) {
            self.held = BytesMut::from(&masked[..]);
        }
        let release = self.held.len().saturating_sub(self.keep);
        (release > 0).then(|| self.held.split_to(release).freeze())
    }

    /// The end of the body: the rest.
    fn finish(&mut self) -> Option<Bytes> {
        (!self.held.is_empty()).then(|| self.held.split().freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::network::SecretConfig;

    fn scrubber(values: &[&str]) -> Scrubber {
        let secrets: Vec<(String, SecretConfig)> = values
            .iter()
            .enumerate()
            .map(|(i, value)| {
                (
                    format!("https://s{i}.example.org"),
                    SecretConfig { header: "x-key".into(), value: (*value).into() },
                )
            })
            .collect();
        let grant = NetworkGrant::parse(&["https://*.example.org".into()], &secrets, |_| None).unwrap();
        Scrubber::new(&grant)
    }

    fn request(uri: &str, host: Option<&str>) -> Request<WasiBody> {
        let mut builder = Request::builder().uri(uri);
        if let Some(host) = host {
            builder = builder.header(header::HOST, host);
        }
        builder.body(http_body_util::Empty::new().map_err(|never| match never {}).boxed_unsync()).unwrap()
    }

    #[test]
    fn a_target_is_read_from_the_url_and_checked_against_its_host_header() {
        let target = target_of(&request("https://API.example.org/x?y", Some("api.example.org"))).unwrap();
        assert_eq!(target.origin(), "https://api.example.org:443");
        let target = target_of(&request("http://[::ffff:127.0.0.1]:8080/", None)).unwrap();
        assert_eq!(target.origin(), "http://127.0.0.1:8080", "judged as the IPv4 address");
        assert_eq!(
            target_of(&request("http://example.org/", Some("evil.org"))).unwrap_err(),
            "its Host header disagrees with the URL's authority example.org"
        );
        assert!(target_of(&request("http://user:pw@example.org/", None)).unwrap_err().contains("user info"));
        assert!(target_of(&request("ftp://example.org/", None)).unwrap_err().contains("not http or https"));
        for url in [
            "http://example.org:99999/",
            "http://example.org:0x50/",
            "http://example.org:/",
            "http://example.org:0/",
        ] {
            assert_eq!(
                target_of(&request(url, None)).unwrap_err(),
                format!("the port of {url} is not a number from 1 to 65535"),
            );
        }
        assert_eq!(target_of(&request("http://[::1]:8080/", None)).unwrap().origin(), "http://[::1]:8080");
        let mut twice = request("http://example.org/", Some("example.org"));
        twice.headers_mut().append(header::HOST, HeaderValue::from_static("example.org"));
        assert!(target_of(&twice).unwrap_err().contains("Host header"), "two Host headers");
    }

    #[test]
    fn secrets_are_masked_with_their_length_kept() {
        let scrubber = scrubber(&["hunter22", "s3cr3t-value"]);
        assert_eq!(scrubber.masked(b"nothing here"), None);
        assert_eq!(scrubber.masked(b"a hunter22 b hunter22").unwrap(), b"a ******** b ********");
        let mut text = "key=s3cr3t-value;".to_string();
        scrubber.scrub(&mut text);
        assert_eq!(text, "key=************;");
    }

    #[test]
    fn a_secret_in_a_header_name_is_masked_in_any_case() {
        let scrubber = scrubber(&["Tok-7F3A9c1E5b"]);
        let mut headers = http::HeaderMap::new();
        headers.append("x-a", HeaderValue::from_static("1"));
        headers.append("tok-7f3a9c1e5b", HeaderValue::from_static("2"));
        headers.append("tok-7f3a9c1e5b", HeaderValue::from_static("3"));
        headers.append("x-tok-7f3a9c1e5b-y", HeaderValue::from_static("Tok-7F3A9c1E5b"));
        scrubber.mask_headers(&mut headers);
        let seen: Vec<(&str, &str)> =
            headers.iter().map(|(name, value)| (name.as_str(), value.to_str().unwrap())).collect();
        assert_eq!(
            seen,
            [
                ("x-a", "1"),
                ("**************", "2"),
                ("**************", "3"),
                ("x-**************-y", "**************")
            ]
        );
    }

    #[test]
    fn a_secret_the_cut_runs_through_is_masked_whole() {
        let scrubber = scrubber(&["hunter22", "s3cr3t-value"]);
        assert_eq!(scrubber.overlap(), 11);
        for (text, max, kept) in [
            ("ab hunter22 cd", 6, "ab ***"),
            ("ab s3cr3t-value", 14, "ab ***********"),
            ("ab s3cr3t-value and more", 3, "ab "),
            ("hunter22", 8, "********"),
            ("é hunter22", 1, ""),
            ("é hunter22", 4, "é *"),
        ] {
            let mut cut = text.to_string();
            scrubber.scrub_cut(&mut cut, max);
            assert_eq!(cut, kept, "{text:?} cut at {max}");
        }
        let mut nothing_hidden = "é and more".to_string();
        Scrubber::default().scrub_cut(&mut nothing_hidden, 3);
        assert_eq!(nothing_hidden, "é ");
    }

    #[test]
    fn a_secret_split_across_chunks_is_still_masked() {
        let scrubber = scrubber(&["s3cr3t-value"]);
        let body = b"head s3cr3t-value middle s3cr3t-value tail";
        for size in 1..body.len() {
            let mut stream = scrubber.stream().unwrap();
            let mut out = Vec::new();
            for chunk in body.chunks(size) {
                if let Some(part) = stream.push(chunk) {
                    out.extend_from_slice(&part);
                }
            }
            if let Some(rest) = stream.finish() {
                out.extend_from_slice(&rest);
            }
            assert_eq!(out, b"head ************ middle ************ tail", "chunks of {size}");
        }
    }
}
