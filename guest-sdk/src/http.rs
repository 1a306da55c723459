//! Outbound HTTP: a small blocking client over `wasi:http`.
//!
//! ```no_run
//! use keel_guest::http;
//!
//! # fn main() -> Result<(), http::Error> {
//! let response = http::get("https://example.com/")?;
//! if response.status == 200 {
//!     let page = response.text()?;
//! #   let _ = page;
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Every request goes through the host, which checks it before it leaves:
//! whether the plugin was granted the destination, whether it resolves to a
//! private address, how many requests and bytes the call has left, how long
//! it may take. A request the host stops fails with [`Error::Refused`],
//! whose message is the host's reason, word for word.
//!
//! Redirects are not followed unless asked for with
//! [`Request::follow_redirects`]: a `3xx` is a response like any other, its
//! target in the `Location` header. A followed redirect is a new request, and
//! the host checks it as it checks the first.
//!
//! A response body is read whole only up to a cap ([`DEFAULT_MAX_BODY`], or
//! [`Request::max_body`]); a longer one is an [`Error::BodyTooLarge`], never a
//! silently shortened body. [`Response::read_up_to`] reads a prefix instead.
//!
//! Outside a keel sandbox (in a tool's native unit tests) there is no
//! network: sending fails with [`Error::Unavailable`]. Code that reads
//! responses can be tested with [`Response::from_parts`].

use std::fmt;

use wasip2::http::types::{ErrorCode, FieldSizePayload};

mod url;

pub use url::Url;

/// The default cap on a response body read whole, 10 MiB: past any page or
/// API answer a tool hands a model, and small enough to hold in a sandbox's
/// memory a few times over while it is decoded.
pub const DEFAULT_MAX_BODY: u64 = 10 << 20;

/// The `user-agent` sent when the request sets none: some sites refuse a
/// request that has none at all.
pub const USER_AGENT: &str = concat!("keel-guest/", env!("CARGO_PKG_VERSION"));

/// The bytes asked of the body stream per read: the host's stream hands back
/// at most what is ready, so this bounds a read, not the body.
const READ_CHUNK: u64 = 64 << 10;

/// The most a body's buffer is sized for up front from its `content-length`,
/// which a server may state falsely: past it, the buffer grows as the bytes
/// come.
const MAX_PRESIZE: u64 = 16 << 20;

/// `GET` a URL.
///
/// ```no_run
/// let response = keel_guest::http::get("https://example.com/")?;
/// println!("{} {:?}", response.status, response.header("content-type"));
/// # Ok::<(), keel_guest::http::Error>(())
/// ```
pub fn get(url: &str) -> Result<Response, Error> {
    Request::new(Method::Get, url).send()
}

/// `POST` a body to a URL. Set a `content-type` with a [`Request`] when the
/// server needs one.
///
/// ```no_run
/// let response = keel_guest::http::post("https://example.com/api", r#"{"q":1}"#)?;
/// # Ok::<(), keel_guest::http::Error>(())
/// ```
pub fn post(url: &str, body: impl Into<Vec<u8>>) -> Result<Response, Error> {
    Request::new(Method::Post, url).body(body).send()
}

/// An HTTP method.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Method {
    /// `GET`
    Get,
    /// `HEAD`
    Head,
    /// `POST`
    Post,
    /// `PUT`
    Put,
    /// `DELETE`
    Delete,
    /// `CONNECT`
    Connect,
    /// `OPTIONS`
    Options,
    /// `TRACE`
    Trace,
    /// `PATCH`
    Patch,
    /// Any other method, by its name.
    Other(String),
}

impl Method {
    /// The method's name: `GET`, `POST`, …
    pub fn as_str(&self) -> &str {
        match self {
            Method::Get => "GET",
            Method::Head => "HEAD",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
            Method::Connect => "CONNECT",
            Method::Options => "OPTIONS",
            Method::Trace => "TRACE",
            Method::Patch => "PATCH",
            Method::Other(name) => name,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request to build and [`send`](Request::send).
///
/// Defaults: no headers but a `user-agent` ([`USER_AGENT`]) and, with a body,
/// its `content-length`; no body; a body cap of [`DEFAULT_MAX_BODY`];
/// redirects not followed.
///
/// ```no_run
/// use keel_guest::http::{Method, Request};
///
/// let response = Request::new(Method::Post, "https://example.com/api/search")
///     .header("content-type", "application/json")
///     .header("accept", "application/json")
///     .body(r#"{"query":"wasm"}"#)
///     .max_body(1 << 20)
///     .follow_redirects(5)
///     .send()?;
/// let answer = response.text()?;
/// # Ok::<(), keel_guest::http::Error>(())
/// ```
#[derive(Clone, Debug)]
#[must_use = "a request does nothing until it is sent"]
pub struct Request {
    method: Method,
    url: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    max_body: u64,
    max_redirects: u32,
}

impl Request {
    /// A request of `method` to `url`, an absolute `http` or `https` URL. The
    /// URL is checked when the request is sent.
    pub fn new(method: Method, url: impl Into<String>) -> Self {
        Request {
            method,
            url: url.into(),
            headers: Vec::new(),
            body: Vec::new(),
            max_body: DEFAULT_MAX_BODY,
            max_redirects: 0,
        }
    }

    /// Add a header. A name may be given more than once; each is sent.
    /// Headers the host owns (`host`, `connection`, `transfer-encoding`, …)
    /// are refused when the request is sent.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// The body to send. Default: none.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = body.into();
        self
    }

    /// The most bytes [`Response::bytes`] and [`Response::text`] read before
    /// they fail with [`Error::BodyTooLarge`]. Default: [`DEFAULT_MAX_BODY`].
    pub fn max_body(mut self, bytes: u64) -> Self {
        self.max_body = bytes;
        self
    }

    /// Follow up to `max` redirects (`301`, `302`, `303`, `307`, `308`), each
    /// as a new request the host checks like the first; more than `max` is an
    /// [`Error::TooManyRedirects`]. `303`, and `301` or `302` after a `POST`,
    /// continue as a `GET` without the body, as browsers do; credentials
    /// (`authorization`, `cookie`) are dropped when a redirect leaves the
    /// origin. Default: 0, a `3xx` is handed back as it is.
    pub fn follow_redirects(mut self, max: u32) -> Self {
        self.max_redirects = max;
        self
    }

    /// Send the request and wait for the response's status and headers; the
    /// body is read afterwards, from the [`Response`].
    pub fn send(self) -> Result<Response, Error> {
        let mut hop =
            Hop { method: self.method, url: Url::parse(&self.url)?, headers: self.headers, body: self.body };
        let mut redirects = 0;
        loop {
            let response = transport::send(&hop.method, &hop.url, &hop.headers, &hop.body, self.max_body)?;
            let location = match response.header("location") {
                Some(location) if self.max_redirects > 0 && response.is_redirect() => location.to_string(),
                _ => return Ok(response),
            };
            if redirects == self.max_redirects {
                return Err(Error::TooManyRedirects { url: hop.url.to_string(), limit: self.max_redirects });
            }
            redirects += 1;
            hop.redirect(response.status, &location)?;
        }
    }
}

/// One request of a chain of redirects.
#[derive(Debug)]
struct Hop {
    method: Method,
    url: Url,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Hop {
    /// Become the request a redirect with `status` to `location` asks for.
    fn redirect(&mut self, status: u16, location: &str) -> Result<(), Error> {
        let next = self.url.join(location).map_err(|error| Error::BadRedirect {
            from: self.url.to_string(),
            location: location.to_string(),
            reason: match error {
                Error::InvalidUrl { reason, .. } => reason,
                other => other.to_string(),
            },
        })?;
        let as_get = status == 303 && self.method != Method::Head
            || matches!(status, 301 | 302) && self.method == Method::Post;
        if as_get {
            self.method = Method::Get;
            self.body.clear();
            self.headers.retain(|(name, _)| !is_one_of(name, &["content-type", "content-length"]));
        }
        if next.origin() != self.url.origin() {
            self.headers.retain(|(name, _)| !is_one_of(name, &["authorization", "cookie"]));
        }
        self.url = next;
        Ok(())
    }
}

fn is_one_of(name: &str, names: &[&str]) -> bool {
    names.iter().any(|candidate| name.eq_ignore_ascii_case(candidate))
}

/// The headers as sent: the request's own, then a `user-agent` and a
/// `content-length` unless it set them.
#[cfg_attr(
    not(any(target_arch = "wasm32", test)),
    expect(dead_code, reason = "only the wasm32 transport sends; the native one fails first")
)]
fn headers_to_send(headers: &[(String, String)], body: &[u8]) -> Vec<(String, String)> {
    let has = |wanted: &str| headers.iter().any(|(name, _)| name.eq_ignore_ascii_case(wanted));
    let mut all = headers.to_vec();
    if !has("user-agent") {
        all.push(("user-agent".to_string(), USER_AGENT.to_string()));
    }
    if !body.is_empty() && !has("content-length") {
        all.push(("content-length".to_string(), body.len().to_string()));
    }
    all
}

/// A response: its status and headers, and a body still to be read.
///
/// The body is read once, by value: [`bytes`](Response::bytes),
/// [`text`](Response::text) or [`read_up_to`](Response::read_up_to).
pub struct Response {
    /// The status code: `200`, `404`, …
    pub status: u16,
    /// The headers in the order received, names as the server sent them.
    pub headers: Vec<(String, String)>,
    url: Url,
    max_body: u64,
    body: Body,
}

impl Response {
    /// A response held in memory, as if `url` had answered it: for the unit
    /// tests of code that reads responses. Its body cap is
    /// [`DEFAULT_MAX_BODY`].
    ///
    /// ```
    /// use keel_guest::http::{Response, Url};
    ///
    /// let url = Url::parse("https://example.com/").unwrap();
    /// let headers = vec![("Content-Type".to_string(), "text/plain".to_string())];
    /// let response = Response::from_parts(url, 200, headers, "hello");
    /// assert_eq!(response.header("content-type"), Some("text/plain"));
    /// assert_eq!(response.text().unwrap(), "hello");
    /// ```
    pub fn from_parts(
        url: Url,
        status: u16,
        headers: Vec<(String, String)>,
        body: impl Into<Vec<u8>>,
    ) -> Self {
        Response { status, headers, url, max_body: DEFAULT_MAX_BODY, body: Body::Memory(body.into(), 0) }
    }

    /// The value of the first header named `name`, compared without regard
    /// to case.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(key, _)| key.eq_ignore_ascii_case(name)).map(|(_, value)| value.as_str())
    }

    /// The URL that answered: the request's, or the last redirect's when
    /// [`Request::follow_redirects`] followed any.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Whether the status is `2xx`.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Whether the status is a redirect with a target: `301`, `302`, `303`,
    /// `307` or `308`.
    pub fn is_redirect(&self) -> bool {
        matches!(self.status, 301 | 302 | 303 | 307 | 308)
    }

    /// The whole body, or [`Error::BodyTooLarge`] when it is longer than the
    /// cap ([`Request::max_body`]). A `content-length` over the cap fails
    /// before anything is read.
    pub fn bytes(mut self) -> Result<Vec<u8>, Error> {
        let limit = self.max_body;
        let too_large = || Error::BodyTooLarge { url: self.url.to_string(), limit };
        let declared = self.header("content-length").and_then(|length| length.trim().parse::<u64>().ok());
        if declared.is_some_and(|length| length > limit) {
            return Err(too_large());
        }
        let prefix = self.body.read_up_to(limit, declared, &self.url)?;
        if prefix.truncated {
            return Err(too_large());
        }
        Ok(prefix.bytes)
    }

    /// The whole body as text, decoded as UTF-8 with invalid sequences
    /// replaced by `U+FFFD`; capped as [`Response::bytes`] is.
    pub fn text(self) -> Result<String, Error> {
        let bytes = self.bytes()?;
        Ok(match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
        })
    }

    /// At most the first `limit` bytes of the body, and whether there was
    /// more: for a tool that shows the start of a long body rather than fail.
    /// The cap of [`Request::max_body`] does not apply.
    pub fn read_up_to(mut self, limit: u64) -> Result<Prefix, Error> {
        let declared = self.header("content-length").and_then(|length| length.trim().parse::<u64>().ok());
        self.body.read_up_to(limit, declared, &self.url)
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers)
            .field("url", &self.url.to_string())
            .finish_non_exhaustive()
    }
}

/// The start of a body, from [`Response::read_up_to`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// The bytes read: all of the body, or its first `limit` bytes.
    pub bytes: Vec<u8>,
    /// Whether the body went on past `limit`.
    pub truncated: bool,
}

/// Where a response's body comes from.
enum Body {
    /// Bytes held in memory, and how many were read.
    Memory(Vec<u8>, usize),
    #[cfg(target_arch = "wasm32")]
    Wasi(transport::IncomingBody),
}

impl Body {
    /// The next bytes, at most `max` of them; `None` at the end.
    fn read(&mut self, max: u64, url: &Url) -> Result<Option<Vec<u8>>, Error> {
        #[cfg(not(target_arch = "wasm32"))]
        let _ = url;
        match self {
            Body::Memory(bytes, read) if *read == bytes.len() => Ok(None),
            Body::Memory(bytes, read) => {
                let end = bytes.len().min(read.saturating_add(usize::try_from(max).unwrap_or(usize::MAX)));
                let chunk = bytes[*read..end].to_vec();
                *read = end;
                Ok(Some(chunk))
            }
            #[cfg(target_arch = "wasm32")]
            Body::Wasi(body) => body.read(max, url),
        }
    }

    /// Read until the end or past `limit`, whichever comes first: one byte
    /// past it tells a body of exactly `limit` bytes from a longer one.
    /// A `declared` length sizes the buffer once, where growing it would
    /// copy the body over and over.
    fn read_up_to(&mut self, limit: u64, declared: Option<u64>, url: &Url) -> Result<Prefix, Error> {
        let expected = declared.map_or(0, |length| length.min(limit.saturating_add(1)).min(MAX_PRESIZE));
        let mut bytes = Vec::with_capacity(usize::try_from(expected).unwrap_or(0));
        while (bytes.len() as u64) <= limit {
            let wanted = (limit - bytes.len() as u64).saturating_add(1).min(READ_CHUNK);
            match self.read(wanted, url)? {
                Some(chunk) => bytes.extend_from_slice(&chunk),
                None => return Ok(Prefix { bytes, truncated: false }),
            }
        }
        bytes.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
        Ok(Prefix { bytes, truncated: true })
    }
}

/// Why a request or the reading of its response failed.
///
/// Each message is written for the model that will read it through a tool's
/// error: [`Error::Refused`] is the host's reason word for word, the others
/// name the URL and what went wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The URL is not an absolute `http` or `https` URL.
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A header cannot be sent: its name or value is malformed, or the host
    /// owns it (`host`, `connection`, …).
    InvalidHeader {
        /// The header's name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The host stopped the request: the destination is not granted, it is a
    /// private address, a limit was reached, time ran out. The message is the
    /// host's, shown as it is (`wasi:http`'s `internal-error` with a message).
    Refused(String),
    /// The request failed on its way: DNS, the connection, TLS, the HTTP
    /// exchange itself.
    Transport {
        /// The URL requested.
        url: String,
        /// What failed, in a few words: `connection refused`.
        reason: String,
    },
    /// The body is longer than the cap ([`Request::max_body`]).
    BodyTooLarge {
        /// The URL that answered.
        url: String,
        /// The cap, in bytes.
        limit: u64,
    },
    /// More redirects than [`Request::follow_redirects`] allows.
    TooManyRedirects {
        /// The URL whose answer was one redirect too many.
        url: String,
        /// The most redirects allowed.
        limit: u32,
    },
    /// A redirect's `Location` is not a URL the client can follow.
    BadRedirect {
        /// The URL that answered with the redirect.
        from: String,
        /// Its `Location` header.
        location: String,
        /// What is wrong with it.
        reason: String,
    },
    /// There is no network outside a keel sandbox: the code runs natively, in
    /// a unit test.
    Unavailable,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::InvalidUrl { url, reason } => write!(f, "invalid URL `{url}`: {reason}"),
            Error::InvalidHeader { name, reason } => write!(f, "invalid header `{name}`: {reason}"),
            Error::Refused(message) => f.write_str(message),
            Error::Transport { url, reason } => write!(f, "failed to fetch {url}: {reason}"),
            Error::BodyTooLarge { url, limit } => {
                write!(f, "the response body of {url} is longer than the limit of {}", size(*limit))
            }
            Error::TooManyRedirects { url, limit } => {
                write!(f, "{url} redirected once more after {limit} redirects, the most allowed")
            }
            Error::BadRedirect { from, location, reason } => {
                write!(f, "{from} redirected to `{location}`, which cannot be followed: {reason}")
            }
            Error::Unavailable => {
                f.write_str("outbound HTTP is only available inside a keel sandbox, not in a native build")
            }
        }
    }
}

impl std::error::Error for Error {}

/// A byte count as people write it: `10 MiB`, `512 KiB`, `1000 bytes`.
fn size(bytes: u64) -> String {
    match bytes {
        0 => "0 bytes".to_string(),
        _ if bytes.is_multiple_of(1 << 30) => format!("{} GiB", bytes >> 30),
        _ if bytes.is_multiple_of(1 << 20) => format!("{} MiB", bytes >> 20),
        _ if bytes.is_multiple_of(1 << 10) => format!("{} KiB", bytes >> 10),
        1 => "1 byte".to_string(),
        _ => format!("{bytes} bytes"),
    }
}

/// `wasi:http` itself: the only code here that calls the host.
#[cfg(target_arch = "wasm32")]
mod transport {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{
        self as wasi, Fields, FutureIncomingResponse, HeaderError, OutgoingBody, OutgoingRequest, Scheme,
    };
    use wasip2::io::streams::{InputStream, StreamError};

    use super::{Body, Error, Method, Response, Url, from_code, headers_to_send, stream_error};

    /// The most bytes `blocking-write-and-flush` takes at once, by the
    /// interface's definition.
    const WRITE_CHUNK: usize = 4096;

    /// A response body being read. The stream is a child of the body, so it
    /// is declared first: fields drop in order, and the host refuses to drop a
    /// resource before its children.
    pub(super) struct IncomingBody {
        stream: InputStream,
        _body: wasi::IncomingBody,
    }

    impl IncomingBody {
        pub(super) fn read(&mut self, max: u64, url: &Url) -> Result<Option<Vec<u8>>, Error> {
            loop {
                match self.stream.blocking_read(max) {
                    // A read that found nothing ready is not the end.
                    Ok(chunk) if chunk.is_empty() => continue,
                    Ok(chunk) => return Ok(Some(chunk)),
                    Err(StreamError::Closed) => return Ok(None),
                    Err(StreamError::LastOperationFailed(error)) => {
                        let code = wasi::http_error_code(&error);
                        return Err(stream_error(url, code, &error.to_debug_string(), "the body broke off"));
                    }
                }
            }
        }
    }

    pub(super) fn send(
        method: &Method,
        url: &Url,
        headers: &[(String, String)],
        body: &[u8],
        max_body: u64,
    ) -> Result<Response, Error> {
        let transport = |reason: String| Error::Transport { url: url.to_string(), reason };
        let entries: Vec<(String, Vec<u8>)> = headers_to_send(headers, body)
            .into_iter()
            .map(|(name, value)| (name, value.into_bytes()))
            .collect();
        let fields = Fields::from_list(&entries).map_err(|error| header_error(&entries, &error))?;
        let request = OutgoingRequest::new(fields);
        request
            .set_method(&wasi_method(method))
            .map_err(|()| transport(format!("the method `{method}` is not a valid HTTP method")))?;
        let scheme = if url.scheme() == "https" { Scheme::Https } else { Scheme::Http };
        request.set_scheme(Some(&scheme)).map_err(|()| transport("the scheme was refused".into()))?;
        request
            .set_authority(Some(&url.authority()))
            .map_err(|()| transport(format!("the authority `{}` was refused", url.authority())))?;
        request
            .set_path_with_query(Some(url.path_and_query()))
            .map_err(|()| transport(format!("the path `{}` was refused", url.path_and_query())))?;

        // An empty body is never taken: a taken body must be finished, and
        // the host sends none for a request whose body was never taken.
        let outgoing = match body.is_empty() {
            true => None,
            false => Some(request.body().map_err(|()| transport("the request body was taken".into()))?),
        };
        let future = outgoing_handler::handle(request, None).map_err(|code| from_code(url, code, ""))?;
        // The body goes out while the host sends the request; a host that
        // stopped the request gives its reason in the response, which beats
        // the write's own error.
        let written = outgoing.map_or(Ok(()), |outgoing| write_body(outgoing, body, url));
        let response = wait(&future, url)?;
        written?;

        let status = response.status();
        let headers = response
            .headers()
            .entries()
            .into_iter()
            .map(|(name, value)| (name, String::from_utf8_lossy(&value).into_owned()))
            .collect();
        let incoming = response.consume().map_err(|()| transport("the response body was taken".into()))?;
        let stream = incoming.stream().map_err(|()| transport("the response body was taken".into()))?;
        Ok(Response {
            status,
            headers,
            url: url.clone(),
            max_body,
            body: Body::Wasi(IncomingBody { stream, _body: incoming }),
        })
    }

    fn write_body(outgoing: OutgoingBody, body: &[u8], url: &Url) -> Result<(), Error> {
        let failed = |reason: String| Error::Transport {
            url: url.to_string(),
            reason: format!("the request body could not be sent: {reason}"),
        };
        let stream = outgoing.write().map_err(|()| failed("its stream was taken".into()))?;
        for chunk in body.chunks(WRITE_CHUNK) {
            stream.blocking_write_and_flush(chunk).map_err(|error| match error {
                StreamError::Closed => failed("the host closed it".into()),
                StreamError::LastOperationFailed(error) => {
                    let code = wasi::http_error_code(&error);
                    stream_error(url, code, &error.to_debug_string(), "the request body could not be sent")
                }
            })?;
        }
        // The stream is the body's child: it goes before the body finishes.
        drop(stream);
        OutgoingBody::finish(outgoing, None).map_err(|code| from_code(url, code, ""))
    }

    fn wait(future: &FutureIncomingResponse, url: &Url) -> Result<wasi::IncomingResponse, Error> {
        loop {
            match future.get() {
                Some(Ok(Ok(response))) => return Ok(response),
                Some(Ok(Err(code))) => return Err(from_code(url, code, "")),
                Some(Err(())) => {
                    return Err(Error::Transport {
                        url: url.to_string(),
                        reason: "the response was already taken".into(),
                    });
                }
                None => future.subscribe().block(),
            }
        }
    }

    fn header_error(entries: &[(String, Vec<u8>)], error: &HeaderError) -> Error {
        // The host names no header: the first one it would refuse is found
        // again here, by asking about each alone.
        let culprit = entries
            .iter()
            .find(|entry| Fields::from_list(std::slice::from_ref(entry)).is_err())
            .map_or_else(String::new, |(name, _)| name.clone());
        let reason = match error {
            HeaderError::InvalidSyntax => "its name or value is not valid in a header",
            HeaderError::Forbidden => "the host sets it; a tool cannot",
            HeaderError::Immutable => "the headers can no longer be changed",
        };
        Error::InvalidHeader { name: culprit, reason: reason.to_string() }
    }

    fn wasi_method(method: &Method) -> wasi::Method {
        match method {
            Method::Get => wasi::Method::Get,
            Method::Head => wasi::Method::Head,
            Method::Post => wasi::Method::Post,
            Method::Put => wasi::Method::Put,
            Method::Delete => wasi::Method::Delete,
            Method::Connect => wasi::Method::Connect,
            Method::Options => wasi::Method::Options,
            Method::Trace => wasi::Method::Trace,
            Method::Patch => wasi::Method::Patch,
            Method::Other(name) => wasi::Method::Other(name.clone()),
        }
    }
}

/// The error for a `wasi:http` error code. `internal-error` with a message is
/// how the host refuses a request (not granted, a private address, a limit):
/// its message is the whole reason, kept as it is. Any other code is described
/// in a few words, after `context` when there is one.
fn from_code(url: &Url, code: ErrorCode, context: &str) -> Error {
    match code {
        ErrorCode::InternalError(Some(message)) => Error::Refused(message),
        code => {
            let reason = match context {
                "" => describe(&code),
                context => format!("{context}: {}", describe(&code)),
            };
            Error::Transport { url: url.to_string(), reason }
        }
    }
}

/// The error for a failed read or write of a body stream: its error code if
/// `http-error-code` recovers one, else its text.
///
/// wasmtime-wasi-http (48) keeps an error that ends a body as its own error
/// type rather than as an error code, so `http-error-code` finds none, and the
/// text of an `internal-error` is then `internal error: <message>`: a refusal
/// the host made mid-body is recognised by that text and kept word for word
/// too.
#[cfg_attr(
    not(any(target_arch = "wasm32", test)),
    expect(dead_code, reason = "only the wasm32 transport sends; the native one fails first")
)]
fn stream_error(url: &Url, code: Option<ErrorCode>, text: &str, context: &str) -> Error {
    match (code, text.strip_prefix("internal error: ")) {
        (Some(code), _) => from_code(url, code, context),
        (None, Some(message)) => Error::Refused(message.to_string()),
        (None, None) => Error::Transport { url: url.to_string(), reason: format!("{context}: {text}") },
    }
}

/// A few words for an error code, as a person would say it.
fn describe(code: &ErrorCode) -> String {
    let limit = |what: &str, size: Option<u64>| match size {
        Some(size) => format!("{what} is over the limit of {size} bytes"),
        None => format!("{what} is over the limit"),
    };
    let field = |what: &str, payload: Option<&FieldSizePayload>| match payload {
        Some(FieldSizePayload { field_name: Some(name), .. }) => format!("the {what} `{name}` is too large"),
        _ => format!("a {what} is too large"),
    };
    match code {
        ErrorCode::DnsTimeout => "DNS lookup timed out".into(),
        ErrorCode::DnsError(payload) => match &payload.rcode {
            Some(rcode) => format!("DNS error ({rcode})"),
            None => "DNS error".into(),
        },
        ErrorCode::DestinationNotFound => "the host name does not resolve".into(),
        ErrorCode::DestinationUnavailable => "the destination is unavailable".into(),
        ErrorCode::DestinationIpProhibited => "the destination address is prohibited".into(),
        ErrorCode::DestinationIpUnroutable => "the destination address is unroutable".into(),
        ErrorCode::ConnectionRefused => "connection refused".into(),
        ErrorCode::ConnectionTerminated => "the connection was closed".into(),
        ErrorCode::ConnectionTimeout => "connection timeout".into(),
        ErrorCode::ConnectionReadTimeout => "timed out reading from the connection".into(),
        ErrorCode::ConnectionWriteTimeout => "timed out writing to the connection".into(),
        ErrorCode::ConnectionLimitReached => "too many connections".into(),
        ErrorCode::TlsProtocolError => "TLS protocol error".into(),
        ErrorCode::TlsCertificateError => "the server's TLS certificate is not valid".into(),
        ErrorCode::TlsAlertReceived(payload) => match &payload.alert_message {
            Some(message) => format!("TLS alert: {message}"),
            None => "TLS alert received".into(),
        },
        ErrorCode::HttpRequestDenied => "the request was denied".into(),
        ErrorCode::HttpRequestLengthRequired => "the server requires a content-length".into(),
        ErrorCode::HttpRequestBodySize(size) => limit("the request body", *size),
        ErrorCode::HttpRequestMethodInvalid => "invalid request method".into(),
        ErrorCode::HttpRequestUriInvalid => "invalid request URI".into(),
        ErrorCode::HttpRequestUriTooLong => "the request URI is too long".into(),
        ErrorCode::HttpRequestHeaderSectionSize(_) => "the request headers are too large".into(),
        ErrorCode::HttpRequestHeaderSize(payload) => field("request header", payload.as_ref()),
        ErrorCode::HttpRequestTrailerSectionSize(_) => "the request trailers are too large".into(),
        ErrorCode::HttpRequestTrailerSize(payload) => field("request trailer", Some(payload)),
        ErrorCode::HttpResponseIncomplete => "the response ended early".into(),
        ErrorCode::HttpResponseHeaderSectionSize(_) => "the response headers are too large".into(),
        ErrorCode::HttpResponseHeaderSize(payload) => field("response header", Some(payload)),
        ErrorCode::HttpResponseBodySize(size) => limit("the response body", *size),
        ErrorCode::HttpResponseTrailerSectionSize(_) => "the response trailers are too large".into(),
        ErrorCode::HttpResponseTrailerSize(payload) => field("response trailer", Some(payload)),
        ErrorCode::HttpResponseTransferCoding(coding) => match coding {
            Some(coding) => format!("unsupported transfer coding `{coding}`"),
            None => "unsupported transfer coding".into(),
        },
        ErrorCode::HttpResponseContentCoding(coding) => match coding {
            Some(coding) => format!("unsupported content coding `{coding}`"),
            None => "unsupported content coding".into(),
        },
        ErrorCode::HttpResponseTimeout => "timed out waiting for the response".into(),
        ErrorCode::HttpUpgradeFailed => "the HTTP upgrade failed".into(),
        ErrorCode::HttpProtocolError => "HTTP protocol error".into(),
        ErrorCode::LoopDetected => "a request loop was detected".into(),
        ErrorCode::ConfigurationError => "the host's HTTP configuration is wrong".into(),
        ErrorCode::InternalError(Some(message)) => message.clone(),
        ErrorCode::InternalError(None) => "internal error in the host".into(),
    }
}

/// No network in a native build: every request fails with
/// [`Error::Unavailable`], so a tool's unit tests see a plain error rather
/// than a trap.
#[cfg(not(target_arch = "wasm32"))]
mod transport {
    use super::{Error, Method, Response, Url};

    pub(super) fn send(
        _method: &Method,
        _url: &Url,
        _headers: &[(String, String)],
        _body: &[u8],
        _max_body: u64,
    ) -> Result<Response, Error> {
        Err(Error::Unavailable)
    }
}

#[cfg(test)]
mod tests {
    use wasip2::http::types::{DnsErrorPayload, TlsAlertReceivedPayload};

    use super::*;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    fn response(headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Response {
        let headers = headers.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        Response::from_parts(url("https://example.com/big"), 200, headers, body)
    }

    fn capped(body: &str, max_body: u64) -> Response {
        Response { max_body, ..response(&[], body) }
    }

    #[test]
    fn a_body_is_read_whole_up_to_the_cap_and_never_cut_silently() {
        assert_eq!(capped("12345", 5).bytes().unwrap(), b"12345");
        assert_eq!(capped("", 0).text().unwrap(), "");
        let error = capped("123456", 5).bytes().unwrap_err();
        assert_eq!(error, Error::BodyTooLarge { url: "https://example.com/big".into(), limit: 5 });
        assert_eq!(
            error.to_string(),
            "the response body of https://example.com/big is longer than the limit of 5 bytes"
        );
        let long = "x".repeat(READ_CHUNK as usize * 3);
        assert_eq!(capped(&long, DEFAULT_MAX_BODY).text().unwrap(), long, "read across chunks");
    }

    #[test]
    fn a_content_length_over_the_cap_fails_before_reading() {
        let response = Response { max_body: 4, ..response(&[("Content-Length", "1000")], "1234") };
        assert_eq!(
            response.bytes().unwrap_err(),
            Error::BodyTooLarge { url: "https://example.com/big".into(), limit: 4 }
        );
    }

    #[test]
    fn the_default_cap_is_named_in_mebibytes() {
        let error = Error::BodyTooLarge { url: "https://example.com/".into(), limit: DEFAULT_MAX_BODY };
        assert_eq!(
            error.to_string(),
            "the response body of https://example.com/ is longer than the limit of 10 MiB"
        );
        assert_eq!(
            (size(1), size(1536), size(512 << 10), size(1 << 30)),
            ("1 byte".into(), "1536 bytes".into(), "512 KiB".into(), "1 GiB".into())
        );
    }

    #[test]
    fn read_up_to_returns_the_prefix_and_whether_it_was_cut() {
        assert_eq!(
            response(&[], "abcdef").read_up_to(4).unwrap(),
            Prefix { bytes: b"abcd".to_vec(), truncated: true }
        );
        assert_eq!(
            response(&[], "abcd").read_up_to(4).unwrap(),
            Prefix { bytes: b"abcd".to_vec(), truncated: false }
        );
        assert_eq!(response(&[], "abc").read_up_to(0).unwrap(), Prefix { bytes: vec![], truncated: true });
        // The cap of `max_body` is for reading whole; a prefix asks for its own.
        assert_eq!(capped("abcdef", 2).read_up_to(10).unwrap().bytes, b"abcdef");
        assert_eq!(response(&[], "abc").read_up_to(u64::MAX).unwrap().bytes, b"abc", "no cap at all");
    }

    #[test]
    fn text_replaces_what_is_not_utf8() {
        assert_eq!(response(&[], b"caf\xc3\xa9 \xff!".to_vec()).text().unwrap(), "café \u{FFFD}!");
    }

    #[test]
    fn headers_are_found_without_regard_to_case_and_status_is_classified() {
        let response = response(&[("Content-Type", "text/html"), ("content-type", "text/plain")], "");
        assert_eq!(response.header("CONTENT-TYPE"), Some("text/html"), "the first of two");
        assert_eq!(response.header("location"), None);
        assert!(response.is_success() && !response.is_redirect());
        let moved = Response { status: 308, ..response };
        assert!(moved.is_redirect() && !moved.is_success());
        assert!(!Response { status: 304, ..moved }.is_redirect(), "not modified has no target");
    }

    #[test]
    fn a_user_agent_and_the_content_length_are_added_unless_set() {
        let added = headers_to_send(&[("accept".into(), "text/html".into())], b"body");
        assert_eq!(
            added,
            [
                ("accept".to_string(), "text/html".to_string()),
                ("user-agent".to_string(), USER_AGENT.to_string()),
                ("content-length".to_string(), "4".to_string()),
            ]
        );
        let own = [("User-Agent".to_string(), "mine/1".to_string())];
        assert_eq!(headers_to_send(&own, b""), own, "no body, no content-length");
    }

    fn hop(method: Method, from: &str) -> Hop {
        let headers =
            [("Authorization", "Bearer t"), ("Content-Type", "application/json"), ("Accept", "*/*")];
        Hop {
            method,
            url: url(from),
            headers: headers.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect(),
            body: b"{}".to_vec(),
        }
    }

    fn names(hop: &Hop) -> Vec<&str> {
        hop.headers.iter().map(|(name, _)| name.as_str()).collect()
    }

    #[test]
    fn a_redirect_keeps_the_request_unless_it_asks_for_a_get() {
        let mut post = hop(Method::Post, "https://example.com/a/form");
        post.redirect(307, "next").unwrap();
        assert_eq!(
            (&post.method, post.url.to_string(), post.body.as_slice()),
            (&Method::Post, "https://example.com/a/next".into(), &b"{}"[..])
        );
        assert_eq!(names(&post), ["Authorization", "Content-Type", "Accept"]);

        for status in [301, 302, 303] {
            let mut post = hop(Method::Post, "https://example.com/form");
            post.redirect(status, "/done").unwrap();
            assert_eq!((&post.method, post.body.is_empty()), (&Method::Get, true), "{status}");
            assert_eq!(names(&post), ["Authorization", "Accept"], "{status}");
        }
        let mut put = hop(Method::Put, "https://example.com/x");
        put.redirect(302, "/y").unwrap();
        assert_eq!(put.method, Method::Put, "only a POST turns into a GET on 301 and 302");
        let mut head = hop(Method::Head, "https://example.com/x");
        head.redirect(303, "/y").unwrap();
        assert_eq!(head.method, Method::Head);
    }

    #[test]
    fn a_redirect_to_another_origin_drops_credentials() {
        let mut get = hop(Method::Get, "https://example.com/");
        get.redirect(302, "https://example.com:8443/").unwrap();
        assert_eq!(names(&get), ["Content-Type", "Accept"]);
        assert_eq!(get.url.origin(), "https://example.com:8443");
    }

    #[test]
    fn a_redirect_to_what_is_not_an_http_url_names_both_ends() {
        let error =
            hop(Method::Get, "https://example.com/").redirect(302, "ftp://files.example.com/").unwrap_err();
        assert_eq!(
            error.to_string(),
            "https://example.com/ redirected to `ftp://files.example.com/`, which cannot be followed: the scheme \
             `ftp` is not supported; only http and https are"
        );
    }

    #[test]
    fn the_hosts_refusal_is_shown_word_for_word() {
        let reason = "fetch may not reach 10.0.0.1: a private address; grant it with `net.allow_private`";
        let error = from_code(
            &url("http://10.0.0.1/"),
            ErrorCode::InternalError(Some(reason.into())),
            "the body broke off",
        );
        assert_eq!(error, Error::Refused(reason.into()));
        assert_eq!(error.to_string(), reason);
    }

    #[test]
    fn a_refusal_that_ends_a_body_is_shown_word_for_word_with_or_without_its_code() {
        let at = url("https://example.com/");
        let reason = "the call's byte budget of 8 bytes is spent";
        let text = format!("internal error: {reason}");
        let coded = ErrorCode::InternalError(Some(reason.into()));
        assert_eq!(
            stream_error(&at, Some(coded), &text, "the body broke off"),
            Error::Refused(reason.into())
        );
        assert_eq!(stream_error(&at, None, &text, "the body broke off"), Error::Refused(reason.into()));
        assert_eq!(
            stream_error(&at, None, "hyper error: connection reset", "the body broke off").to_string(),
            "failed to fetch https://example.com/: the body broke off: hyper error: connection reset"
        );
        assert_eq!(
            stream_error(&at, Some(ErrorCode::ConnectionTerminated), "ignored", "the body broke off")
                .to_string(),
            "failed to fetch https://example.com/: the body broke off: the connection was closed"
        );
    }

    #[test]
    fn other_error_codes_are_described_in_a_few_words_with_the_url() {
        let at = url("https://example.com/");
        let message = |code: ErrorCode, context: &str| from_code(&at, code, context).to_string();
        assert_eq!(
            message(ErrorCode::ConnectionRefused, ""),
            "failed to fetch https://example.com/: connection refused"
        );
        assert_eq!(
            message(ErrorCode::ConnectionTimeout, ""),
            "failed to fetch https://example.com/: connection timeout"
        );
        assert_eq!(
            message(
                ErrorCode::DnsError(DnsErrorPayload { rcode: Some("NXDOMAIN".into()), info_code: None }),
                ""
            ),
            "failed to fetch https://example.com/: DNS error (NXDOMAIN)"
        );
        assert_eq!(
            message(ErrorCode::ConnectionTerminated, "the body broke off"),
            "failed to fetch https://example.com/: the body broke off: the connection was closed"
        );
        assert_eq!(
            message(ErrorCode::HttpResponseBodySize(Some(100)), ""),
            "failed to fetch https://example.com/: the response body is over the limit of 100 bytes"
        );
        assert_eq!(
            message(
                ErrorCode::TlsAlertReceived(TlsAlertReceivedPayload { alert_id: None, alert_message: None }),
                ""
            ),
            "failed to fetch https://example.com/: TLS alert received"
        );
        assert_eq!(
            message(ErrorCode::InternalError(None), ""),
            "failed to fetch https://example.com/: internal error in the host"
        );
    }

    #[test]
    fn a_native_build_sends_nothing() {
        assert_eq!(get("https://example.com/").unwrap_err(), Error::Unavailable);
        assert_eq!(
            post("example.com", "x").unwrap_err().to_string(),
            "invalid URL `example.com`: it has no scheme; write it in full, such as `https://example.com`"
        );
    }
}
