//! A registry that answers as a test tells it to, on a loopback port: a
//! hostile or broken one that a real registry cannot be made into. Each
//! connection carries one request and is closed after its answer; every
//! request is recorded, with its `Authorization` header.

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a fake registry serves at most, whatever the test does.
const LIFETIME: Duration = Duration::from_secs(300);

/// A request the registry got.
#[derive(Clone, Debug)]
pub struct Request {
    /// `GET`, `HEAD`, …
    pub method: String,
    /// The path with its query.
    pub path: String,
    /// The `Authorization` header, if any.
    pub authorization: Option<String>,
}

/// What the registry answers.
pub enum Answer {
    /// A whole answer: status, headers, body.
    Full(u16, Vec<(String, String)>, Vec<u8>),
    /// `200 OK` of `content_type` with no length: `head`, then filler
    /// bytes, until `limit` bytes are sent or the client hangs up.
    Endless {
        /// The `Content-Type`.
        content_type: &'static str,
        /// The first bytes.
        head: Vec<u8>,
        /// The most bytes sent.
        limit: usize,
    },
}

impl Answer {
    /// A JSON answer of `status`.
    pub fn json(status: u16, body: &str) -> Answer {
        Answer::Full(
            status,
            vec![("content-type".into(), "application/json".into())],
            body.as_bytes().to_vec(),
        )
    }

    /// A `401` asking for `challenge` (a `WWW-Authenticate` value).
    pub fn challenge(challenge: &str) -> Answer {
        let body = br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#.to_vec();
        Answer::Full(
            401,
            vec![
                ("content-type".into(), "application/json".into()),
                ("www-authenticate".into(), challenge.into()),
            ],
            body,
        )
    }
}

/// A fake registry; stops when dropped.
pub struct FakeRegistry {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    seen: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeRegistry {
    /// Serve on a loopback port, answering each request as `answer` says.
    pub fn start(answer: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        listener.set_nonblocking(true).unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let answer = Arc::new(answer);
        let thread = {
            let (seen, stop) = (seen.clone(), stop.clone());
            std::thread::spawn(move || {
                let deadline = Instant::now() + LIFETIME;
                while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let (seen, answer, stop) = (seen.clone(), answer.clone(), stop.clone());
                            std::thread::spawn(move || serve(stream, &seen, &*answer, &stop));
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        FakeRegistry { addr, seen, stop, thread: Some(thread) }
    }

    /// The requests it got so far.
    pub fn seen(&self) -> Vec<Request> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Read one request from `stream`, record it, answer it, close.
fn serve(
    mut stream: TcpStream,
    seen: &Mutex<Vec<Request>>,
    answer: &dyn Fn(&Request) -> Answer,
    stop: &AtomicBool,
) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = stream.set_write_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut byte = [0; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 64 << 10 {
        match stream.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut lines = head.lines();
    let mut first = lines.next().unwrap_or_default().split(' ');
    let (method, path) =
        (first.next().unwrap_or_default().to_owned(), first.next().unwrap_or_default().to_owned());
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    let header = |name: &str| headers.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    // A body (a push's) is read and dropped, to a bound.
    let length: u64 = header("content-length").and_then(|length| length.parse().ok()).unwrap_or(0);
    let _ = std::io::copy(&mut (&mut stream).take(length.min(64 << 20)), &mut std::io::sink());
    let request = Request { method, path, authorization: header("authorization") };
    seen.lock().unwrap().push(request.clone());
    let _ = match answer(&request) {
        Answer::Full(status, headers, body) => {
            let mut out =
                format!("HTTP/1.1 {status} X\r\nconnection: close\r\ncontent-length: {}\r\n", body.len());
            for (name, value) in headers {
                out.push_str(&format!("{name}: {value}\r\n"));
            }
            out.push_str("\r\n");
            let mut out = out.into_bytes();
            if request.method != "HEAD" {
                out.extend_from_slice(&body);
            }
            stream.write_all(&out)
        }
        Answer::Endless { content_type, head, limit } => {
            let start =
                format!("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-type: {content_type}\r\n\r\n");
            let filler = vec![b'A'; 1 << 16];
            let mut sent = head.len();
            let mut result = stream.write_all(start.as_bytes()).and_then(|()| stream.write_all(&head));
            while result.is_ok() && sent < limit && !stop.load(Ordering::Relaxed) {
                result = stream.write_all(&filler);
                sent += filler.len();
            }
            result
        }
    };
}
