//! `fetch`: read a URL over HTTP and hand back its text.
//!
//! An HTML page is reduced to the text a reader sees ([`html::to_text`]); other
//! text (plain, JSON, XML, CSS, …) comes back as it is; anything else (an
//! image, an archive) is an error naming its content type. `fetch` asks for
//! a body as it is (`accept-encoding: identity`) and decodes no other: a
//! compressed one is an error naming its content encoding. A status other
//! than `2xx` is an error naming it, and a redirect names its target without
//! following it, so the model decides whether to fetch that too.
//!
//! Open-world, read-only and concurrency-safe; its permission subject is the
//! URL's origin (`https://example.com:8443`), so a rule grants a site. The
//! host checks every request as well: a destination it does not allow fails
//! with the host's own reason.

use keel_guest::http::{self, Response, Url};
use keel_guest::{Context, Interrupt, Output, Plan, Result, Tool, bail};
use schemars::JsonSchema;
use serde::Deserialize;

pub mod html;

/// How much of a body `fetch` reads unless `max_bytes` says otherwise, 1 MiB:
/// more than nearly any page's HTML, and the text it reduces to is already
/// past what the host shows a model before persisting the rest.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 20;

/// The most `max_bytes` may ask for: the SDK's own cap on a body.
pub const MAX_MAX_BYTES: u64 = http::DEFAULT_MAX_BODY;

/// How much of an error page is read to quote its start: enough for an API's
/// error object or a page's first paragraph.
const ERROR_BODY_BYTES: u64 = 4 << 10;

/// How many characters of an error page's text are quoted.
const ERROR_EXCERPT_CHARS: usize = 500;

/// Input of `fetch`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The URL to fetch: a full `http://` or `https://` URL.
    pub url: String,
    /// The most bytes of the body to read, from 1 to 10485760 (10 MiB); a
    /// longer body is cut there, and the result says so. Default: 1048576
    /// (1 MiB).
    #[serde(default)]
    pub max_bytes: Option<u64>,
}

/// The `fetch` tool.
pub struct Fetch;

impl Tool for Fetch {
    type Input = Input;
    const NAME: &str = "fetch";
    const DESCRIPTION: &str = "Fetches an http or https URL and returns its body as text; an HTML \
        page is reduced to its readable text, its title on the first line. Content that is not \
        text (images, archives) is refused. Redirects are not followed: a redirect is reported \
        with its target, to fetch next if wanted.";
    const FIXED_PLAN: Option<Plan> = Some(Plan::SAFE_READ_ONLY);
    const SEARCH_HINT: Option<&str> = Some("fetch a web page or URL as text");
    const INTERRUPT: Interrupt = Interrupt::Cancel;

    fn is_destructive(_input: &Input, _cx: &Context) -> bool {
        false
    }

    fn is_open_world(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn is_search_or_read(_input: &Input, _cx: &Context) -> bool {
        true
    }

    fn validate_input(input: &Input, _cx: &Context) -> Result<()> {
        if let Err(http::Error::InvalidUrl { reason, .. }) = Url::parse(&input.url) {
            bail!("`url` must be a full http or https URL: {reason}");
        }
        if let Some(max) = input.max_bytes.filter(|max| !(1..=MAX_MAX_BYTES).contains(max)) {
            bail!("`max_bytes` must be from 1 to {MAX_MAX_BYTES} (10 MiB), got {max}");
        }
        Ok(())
    }

    fn permission_subject(input: &Input, _cx: &Context) -> Option<String> {
        // An input that is no URL never runs (validation refuses it); its
        // subject is the text as given, which no site's rule matches.
        Some(Url::parse(&input.url).map_or_else(|_| input.url.trim().to_string(), |url| url.origin()))
    }

    fn classifier_input(input: &Input, _cx: &Context) -> String {
        input.url.clone()
    }

    fn activity_description(input: &Input, _cx: &Context) -> Option<String> {
        Some(format!("Fetching {}", input.url.trim()))
    }

    fn call(input: Input, _cx: &Context) -> Result<Output> {
        let url = Url::parse(&input.url)?;
        let response = http::Request::new(http::Method::Get, url.to_string())
            .header("accept-encoding", "identity")
            .send()?;
        read(response, input.max_bytes.unwrap_or(DEFAULT_MAX_BYTES))
    }
}

/// What `fetch` hands back for `response`, reading at most `max_bytes` of
/// its body.
pub fn read(response: Response, max_bytes: u64) -> Result<Output> {
    let url = response.url().clone();
    let status = response.status;
    let answered = match reason_phrase(status) {
        Some(phrase) => format!("{url} answered {status} {phrase}"),
        None => format!("{url} answered {status}"),
    };
    if (300..400).contains(&status) {
        match response.header("location") {
            Some(location) => {
                let target =
                    url.join(location).map_or_else(|_| location.to_string(), |target| target.to_string());
                bail!(
                    "{answered}, a redirect to {target}; redirects are not followed: fetch {target} to read it"
                );
            }
            None => bail!("{answered}"),
        }
    }
    if !response.is_success() {
        match error_excerpt(response) {
            Some(excerpt) => bail!("{answered}:\n{excerpt}"),
            None => bail!("{answered}"),
        }
    }

    if let Some(encoding) = encoding(&response) {
        bail!("{url} answered with content encoding {encoding}, which fetch does not decode");
    }
    let content_type = response.header("content-type").map(str::to_string);
    let declared = match content_type.as_deref() {
        Some(content_type) => match Kind::of(content_type) {
            Some(kind) => Some(kind),
            None => bail!(
                "{url} answered with content type {}, which is not text; fetch reads text and HTML only",
                media_type(content_type)
            ),
        },
        None => None,
    };
    let body = response.read_up_to(max_bytes)?;
    let kind = match declared {
        Some(kind) => kind,
        None => match Kind::sniff(&body.bytes) {
            Some(kind) => kind,
            None => bail!(
                "{url} answered with no content type and a body that is not text; fetch reads text and HTML only"
            ),
        },
    };
    let charset = content_type.as_deref().and_then(charset).or_else(|| match kind {
        Kind::Html => meta_charset(&body.bytes),
        Kind::Text => None,
    });
    let truncated = body.truncated;
    let text = decode(body.bytes, charset.as_deref(), truncated);
    let mut text = match kind {
        Kind::Html => html::to_text(&text),
        Kind::Text => text,
    };
    if text.trim().is_empty() {
        return Ok(Output::text(match kind {
            Kind::Html => format!(
                "{answered}, a page with no text (a page built by JavaScript shows none until it runs, \
                 and fetch runs no scripts)"
            ),
            Kind::Text => format!("{answered}, with an empty body"),
        }));
    }
    if truncated {
        text.push_str(&format!(
            "\n\n[cut: only the first {max_bytes} bytes of the body were read; a larger `max_bytes` \
             (at most {MAX_MAX_BYTES}) reads more]"
        ));
    }
    Ok(Output::text(text))
}

/// The `content-encoding` of `response` when it is other than `identity`:
/// its bytes are compressed (`gzip`, `br`, …), no text to read as it is.
/// A server may send one though `fetch` asked for none.
fn encoding(response: &Response) -> Option<&str> {
    let encoding = response.header("content-encoding")?.trim();
    let identity = encoding
        .split(',')
        .map(str::trim)
        .all(|coding| coding.is_empty() || coding.eq_ignore_ascii_case("identity"));
    (!identity).then_some(encoding)
}

/// How a body is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Reduced to its readable text.
    Html,
    /// Handed back as it is.
    Text,
}

impl Kind {
    /// The kind a `content-type` declares, or `None` when it is not text.
    fn of(content_type: &str) -> Option<Kind> {
        let media_type = media_type(content_type);
        let (kind, subtype) = media_type.split_once('/').unwrap_or((&media_type, ""));
        match (kind, subtype) {
            ("text", "html") | ("application", "xhtml+xml") => Some(Kind::Html),
            ("text", _) => Some(Kind::Text),
            (_, subtype) if subtype.ends_with("+json") || subtype.ends_with("+xml") => Some(Kind::Text),
            ("application", subtype) if TEXT_APPLICATION_TYPES.contains(&subtype) => Some(Kind::Text),
            _ => None,
        }
    }

    /// The kind of a body that came without a `content-type`: text when its
    /// start has no NUL byte and is UTF-8 (but perhaps for a character cut
    /// at the end), HTML when it starts like a document.
    fn sniff(body: &[u8]) -> Option<Kind> {
        let start = without_partial_char(&body[..body.len().min(1024)]);
        if start.contains(&0) || std::str::from_utf8(start).is_err() {
            return None;
        }
        let head = String::from_utf8_lossy(start).trim_start().to_ascii_lowercase();
        Some(if head.starts_with("<!doctype html") || head.starts_with("<html") {
            Kind::Html
        } else {
            Kind::Text
        })
    }
}

/// `application/…` types that are text.
const TEXT_APPLICATION_TYPES: &[&str] = &[
    "json",
    "xml",
    "javascript",
    "ecmascript",
    "x-javascript",
    "yaml",
    "x-yaml",
    "toml",
    "x-toml",
    "x-sh",
    "x-shellscript",
    "sql",
    "graphql",
    "x-ndjson",
    "ndjson",
    "jsonl",
    "csv",
    "x-www-form-urlencoded",
    "x-tex",
    "x-latex",
];

/// The media type of a `content-type`, lowercased and without parameters.
fn media_type(content_type: &str) -> String {
    content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase()
}

/// The `charset` parameter of a `content-type`, lowercased.
fn charset(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|parameter| {
        let (name, value) = parameter.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("charset")
            .then(|| value.trim().trim_matches(['"', '\'']).to_ascii_lowercase())
    })
}

/// The charset a page declares in a `<meta>` near its start, as a browser
/// looks for it when the header declares none.
fn meta_charset(body: &[u8]) -> Option<String> {
    let start = String::from_utf8_lossy(&body[..body.len().min(1024)]).to_ascii_lowercase();
    let at = start.find("charset=")? + "charset=".len();
    let value = start[at..].trim_start_matches(['"', '\'']);
    let end =
        value.find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))).unwrap_or(value.len());
    Some(value[..end].to_string()).filter(|value| !value.is_empty())
}

/// The body as text. UTF-8 unless the charset is one of the Latin-1 family,
/// which is read as windows-1252 (as browsers read all of them); any other
/// charset is read as UTF-8, with what does not decode replaced by `U+FFFD`.
/// A body cut short loses the partial character at its end.
fn decode(bytes: Vec<u8>, charset: Option<&str>, truncated: bool) -> String {
    let latin = matches!(
        charset,
        Some("iso-8859-1" | "iso8859-1" | "latin1" | "l1" | "windows-1252" | "cp1252" | "us-ascii" | "ascii")
    );
    if latin {
        return bytes.iter().map(|&byte| windows_1252(byte)).collect();
    }
    let mut bytes = bytes;
    if truncated {
        let whole = without_partial_char(&bytes).len();
        bytes.truncate(whole);
    }
    // Most text is valid UTF-8: checked whole, it is checked a word at a
    // time and kept where it is, and only text that is not pays for repairs.
    match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
    }
}

/// `bytes` without a UTF-8 sequence cut off at its end.
fn without_partial_char(bytes: &[u8]) -> &[u8] {
    for back in 1..=bytes.len().min(4) {
        let byte = bytes[bytes.len() - back];
        if byte & 0xC0 == 0x80 {
            continue;
        }
        let length = match byte {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if length > back { &bytes[..bytes.len() - back] } else { bytes };
    }
    bytes
}

/// A windows-1252 byte as a character: Latin-1, but for the printable
/// characters in `0x80..=0x9F`.
fn windows_1252(byte: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8D}', 'Ž', '\u{8F}',
        '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9D}', 'ž', 'Ÿ',
    ];
    match byte {
        0x80..=0x9F => HIGH[usize::from(byte - 0x80)],
        byte => char::from(byte),
    }
}

/// The start of an error response's text, if it has any: an API's error
/// object or a page's first lines often say what went wrong.
fn error_excerpt(response: Response) -> Option<String> {
    if encoding(&response).is_some() {
        return None;
    }
    let kind = match response.header("content-type") {
        Some(content_type) => Kind::of(content_type)?,
        None => Kind::Text,
    };
    let body = response.read_up_to(ERROR_BODY_BYTES).ok()?;
    let truncated = body.truncated;
    let text = decode(body.bytes, None, truncated);
    let text = match kind {
        Kind::Html => html::to_text(&text),
        Kind::Text => text.trim().to_string(),
    };
    let mut excerpt: String = text.chars().take(ERROR_EXCERPT_CHARS).collect();
    if excerpt.is_empty() {
        return None;
    }
    if truncated || excerpt.len() < text.len() {
        excerpt.push('…');
    }
    Some(excerpt)
}

/// The reason phrase of a status a model is likely to meet.
fn reason_phrase(status: u16) -> Option<&'static str> {
    Some(match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        203 => "Non-Authoritative Information",
        204 => "No Content",
        206 => "Partial Content",
        300 => "Multiple Choices",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        402 => "Payment Required",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        407 => "Proxy Authentication Required",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        418 => "I'm a teapot",
        421 => "Misdirected Request",
        422 => "Unprocessable Content",
        425 => "Too Early",
        426 => "Upgrade Required",
        428 => "Precondition Required",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        451 => "Unavailable For Legal Reasons",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => return None,
    })
}

keel_guest::export!(Fetch);

#[cfg(test)]
mod tests {
    use keel_guest::json;

    use super::*;

    fn response(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Response {
        let url = Url::parse("https://example.com/docs/page").unwrap();
        let headers = headers.iter().map(|(name, value)| (name.to_string(), value.to_string())).collect();
        Response::from_parts(url, status, headers, body)
    }

    fn fetched(status: u16, headers: &[(&str, &str)], body: impl Into<Vec<u8>>) -> Result<String> {
        read(response(status, headers, body), DEFAULT_MAX_BYTES).map(|output| output.text())
    }

    fn input(url: &str) -> Input {
        Input { url: url.into(), max_bytes: None }
    }

    #[test]
    fn an_html_page_is_reduced_to_its_text_with_the_title_first() {
        let page = "<html><head><title>Docs</title><script>x()</script></head>\
                    <body><h1>Intro</h1><p>Read <a href=/more>more</a>.</p></body></html>";
        let text = fetched(200, &[("Content-Type", "text/html; charset=utf-8")], page).unwrap();
        assert_eq!(text, "Docs\n\nIntro\n\nRead more.");
    }

    #[test]
    fn text_json_and_xml_come_back_as_they_are() {
        let json = r#"{ "a": [1, 2] }"#;
        assert_eq!(fetched(200, &[("content-type", "application/json")], json).unwrap(), json);
        assert_eq!(fetched(200, &[("content-type", "application/ld+json")], json).unwrap(), json);
        let text = "line one\n  line <b>two</b>\n";
        assert_eq!(fetched(200, &[("content-type", "text/plain")], text).unwrap(), text);
        assert_eq!(fetched(200, &[("content-type", "application/rss+xml")], "<rss/>").unwrap(), "<rss/>");
        assert_eq!(fetched(201, &[("content-type", "TEXT/CSV")], "a,b").unwrap(), "a,b");
    }

    #[test]
    fn content_that_is_not_text_is_refused_by_its_type() {
        let error = fetched(200, &[("content-type", "image/png")], [0x89, b'P', b'N', b'G']).unwrap_err();
        assert_eq!(
            error.message(),
            "https://example.com/docs/page answered with content type image/png, which is not text; \
             fetch reads text and HTML only"
        );
        let error = fetched(200, &[("content-type", "Application/Octet-Stream; x=1")], "").unwrap_err();
        assert!(
            error.message().contains("content type application/octet-stream, which is not text"),
            "{error}"
        );
    }

    #[test]
    fn an_encoded_body_is_refused_by_its_encoding() {
        let gzip = [0x1f, 0x8b, 0x08, 0x00, b'x', 0xff];
        let error =
            fetched(200, &[("content-type", "text/plain"), ("Content-Encoding", "gzip")], gzip).unwrap_err();
        assert_eq!(
            error.message(),
            "https://example.com/docs/page answered with content encoding gzip, which fetch does not decode"
        );
        let error = fetched(200, &[("content-encoding", "identity, br")], "").unwrap_err();
        assert!(error.message().contains("content encoding identity, br, which"), "{error}");
        let error = fetched(404, &[("content-encoding", "gzip")], gzip).unwrap_err();
        assert_eq!(error.message(), "https://example.com/docs/page answered 404 Not Found", "nothing quoted");
        let plain =
            fetched(200, &[("content-type", "text/plain"), ("content-encoding", "Identity")], "as is");
        assert_eq!(plain.unwrap(), "as is");
    }

    #[test]
    fn a_body_without_a_content_type_is_sniffed() {
        assert_eq!(fetched(200, &[], "plain words").unwrap(), "plain words");
        assert_eq!(fetched(200, &[], "  <!DOCTYPE html><title>T</title><p>x").unwrap(), "T\n\nx");
        let error = fetched(200, &[], [0x00, 0x01, 0xff]).unwrap_err();
        assert_eq!(
            error.message(),
            "https://example.com/docs/page answered with no content type and a body that is not text; \
             fetch reads text and HTML only"
        );
    }

    #[test]
    fn a_redirect_is_reported_with_its_target_and_not_followed() {
        let error = fetched(301, &[("Location", "../moved?x=1")], "").unwrap_err();
        assert_eq!(
            error.message(),
            "https://example.com/docs/page answered 301 Moved Permanently, a redirect to \
             https://example.com/moved?x=1; redirects are not followed: fetch https://example.com/moved?x=1 \
             to read it"
        );
        let error = fetched(304, &[], "").unwrap_err();
        assert_eq!(error.message(), "https://example.com/docs/page answered 304 Not Modified");
    }

    #[test]
    fn an_error_status_is_named_with_the_start_of_its_body() {
        let error =
            fetched(404, &[("content-type", "text/html")], "<title>Missing</title><p>No such page</p>")
                .unwrap_err();
        assert_eq!(
            error.message(),
            "https://example.com/docs/page answered 404 Not Found:\nMissing\n\nNo such page"
        );
        let error =
            fetched(429, &[("content-type", "application/json")], r#"{"error":"slow down"}"#).unwrap_err();
        assert_eq!(
            error.message(),
            "https://example.com/docs/page answered 429 Too Many Requests:\n{\"error\":\"slow down\"}"
        );
        let error = fetched(500, &[("content-type", "image/gif")], "GIF89a").unwrap_err();
        assert_eq!(error.message(), "https://example.com/docs/page answered 500 Internal Server Error");
        let error = fetched(599, &[], "").unwrap_err();
        assert_eq!(error.message(), "https://example.com/docs/page answered 599");
        let long = "x".repeat(ERROR_EXCERPT_CHARS + 10);
        let error = fetched(400, &[], long).unwrap_err();
        assert!(error.message().ends_with(&format!("\n{}…", "x".repeat(ERROR_EXCERPT_CHARS))), "{error}");
    }

    #[test]
    fn a_long_body_is_cut_at_max_bytes_and_says_so() {
        let output = read(response(200, &[("content-type", "text/plain")], "0123456789"), 4).unwrap();
        assert_eq!(
            output.text(),
            "0123\n\n[cut: only the first 4 bytes of the body were read; a larger `max_bytes` (at most \
             10485760) reads more]"
        );
        let exact = read(response(200, &[("content-type", "text/plain")], "0123"), 4).unwrap();
        assert_eq!(exact.text(), "0123");
        // The cut falls inside `é` (two bytes): the half character is dropped.
        let output = read(response(200, &[("content-type", "text/plain")], "abé"), 3).unwrap();
        assert!(output.text().starts_with("ab\n\n[cut: "), "{}", output.text());
    }

    #[test]
    fn latin_1_pages_are_decoded_as_windows_1252() {
        let body = [b'c', b'a', b'f', 0xE9, b' ', 0x93, b'q', 0x94, b' ', 0x80];
        let text = fetched(200, &[("content-type", "text/plain; charset=ISO-8859-1")], body).unwrap();
        assert_eq!(text, "café “q” €");
        let page = b"<meta charset=\"windows-1252\"><p>na\xEFve</p>".to_vec();
        assert_eq!(fetched(200, &[("content-type", "text/html")], page).unwrap(), "naïve");
        assert_eq!(
            fetched(200, &[("content-type", "text/plain")], b"bad \xff byte".to_vec()).unwrap(),
            "bad \u{FFFD} byte"
        );
    }

    #[test]
    fn an_empty_body_or_a_page_without_text_says_so() {
        assert_eq!(
            fetched(200, &[("content-type", "text/plain")], "").unwrap(),
            "https://example.com/docs/page answered 200 OK, with an empty body"
        );
        let text =
            fetched(200, &[("content-type", "text/html")], "<div id=app></div><script>boot()</script>")
                .unwrap();
        assert!(
            text.starts_with("https://example.com/docs/page answered 200 OK, a page with no text"),
            "{text}"
        );
    }

    #[test]
    fn validate_input_rejects_what_is_not_an_http_url_and_a_bad_max_bytes() {
        let cx = Context::workspace_root();
        assert_eq!(Fetch::validate_input(&input("https://example.com/"), &cx), Ok(()));
        let message = |input: &Input| Fetch::validate_input(input, &cx).unwrap_err().message().to_string();
        assert_eq!(
            message(&input("ftp://example.com/f")),
            "`url` must be a full http or https URL: the scheme `ftp` is not supported; only http and https are"
        );
        assert_eq!(
            message(&input("example.com")),
            "`url` must be a full http or https URL: it has no scheme; write it in full, such as \
             `https://example.com`"
        );
        let too_many = Input { url: "https://example.com/".into(), max_bytes: Some(MAX_MAX_BYTES + 1) };
        assert_eq!(message(&too_many), "`max_bytes` must be from 1 to 10485760 (10 MiB), got 10485761");
        let zero = Input { url: "https://example.com/".into(), max_bytes: Some(0) };
        assert_eq!(message(&zero), "`max_bytes` must be from 1 to 10485760 (10 MiB), got 0");
    }

    #[test]
    fn answers_as_an_open_world_read_and_names_the_origin() {
        let cx = Context::workspace_root();
        let page = input("HTTPS://Docs.Example.com:443/a/b?q=1");
        assert!(Fetch::is_open_world(&page, &cx));
        assert!(Fetch::is_read_only(&page, &cx) && Fetch::is_concurrency_safe(&page, &cx));
        assert!(!Fetch::is_destructive(&page, &cx));
        assert_eq!(Fetch::permission_subject(&page, &cx).as_deref(), Some("https://docs.example.com"));
        let local = input("http://localhost:8080/x");
        assert_eq!(Fetch::permission_subject(&local, &cx).as_deref(), Some("http://localhost:8080"));
        assert_eq!(
            Fetch::activity_description(&page, &cx).as_deref(),
            Some("Fetching HTTPS://Docs.Example.com:443/a/b?q=1")
        );
        assert_eq!(Fetch::classifier_input(&page, &cx), "HTTPS://Docs.Example.com:443/a/b?q=1");
    }

    #[test]
    fn the_input_schema_documents_both_fields() {
        let schema = keel_guest::schema_for::<Input>();
        assert_eq!(schema["required"], json!(["url"]));
        assert!(schema["properties"]["max_bytes"]["description"].as_str().unwrap().contains("1 MiB"));
    }

    #[test]
    fn a_native_build_has_no_network() {
        let error = Fetch::call(input("https://example.com/"), &Context::workspace_root()).unwrap_err();
        assert_eq!(
            error.message(),
            "outbound HTTP is only available inside a keel sandbox, not in a native build"
        );
    }
}
