//! HTML reduced to the text a person reads on the page.
//!
//! Not a parser: one pass over the markup that keeps text, turns block
//! elements into line breaks, and drops what is never shown (the head but its
//! title, scripts, styles, `noscript`, templates, inline SVG). Malformed HTML
//! degrades into more or less text, never into an error, and the pass is
//! linear in the input, whatever it holds.

/// Elements whose content is never read: skipped up to their end tag. The
/// content of `script` and `style` is not markup, so only the end tag can end
/// it; the others are skipped the same way because nothing in them is text a
/// reader sees.
const SKIPPED: &[&str] = &["script", "style", "noscript", "template", "svg", "iframe", "object"];

/// Elements that stand as a paragraph: a blank line before and after.
const PARAGRAPHS: &[&str] = &[
    "p",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "ul",
    "ol",
    "dl",
    "table",
    "blockquote",
    "pre",
    "figure",
    "hr",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "aside",
    "main",
    "form",
    "fieldset",
    "details",
    "address",
];

/// Elements that start a line of their own.
const LINES: &[&str] = &[
    "div",
    "li",
    "dt",
    "dd",
    "tr",
    "caption",
    "figcaption",
    "summary",
    "legend",
    "option",
    "center",
    "body",
    "html",
    "textarea",
    "label",
    "menu",
];

/// Elements allowed in `<head>`; any other start tag ends a head whose end
/// tag was left out, as a browser ends it.
const HEAD_CONTENT: &[&str] =
    &["head", "title", "meta", "link", "base", "style", "script", "noscript", "template"];

/// The readable text of an HTML document: the `<title>`, if there is one, as
/// the first line, a blank line, then the body's text. Lines are separated by
/// `\n`, paragraphs by a blank line; whitespace is collapsed as a browser
/// collapses it, except inside `<pre>`.
pub fn to_text(html: &str) -> String {
    let mut reducer = Reducer { html, at: 0, out: Writer::default(), title: None, in_head: false, pre: 0 };
    reducer.run();
    let body = reducer.out.finish();
    match reducer.title.filter(|title| !title.is_empty()) {
        Some(title) if body.is_empty() => title,
        Some(title) => format!("{title}\n\n{body}"),
        None => body,
    }
}

struct Reducer<'a> {
    html: &'a str,
    at: usize,
    out: Writer,
    title: Option<String>,
    in_head: bool,
    /// How many `<pre>` elements are open.
    pre: usize,
}

impl Reducer<'_> {
    fn run(&mut self) {
        while self.at < self.html.len() {
            let rest = &self.html[self.at..];
            let Some(lt) = rest.find('<') else {
                self.text(rest);
                break;
            };
            self.text(&rest[..lt]);
            self.at += lt;
            self.markup();
        }
    }

    /// Text between tags, kept unless it is in the head.
    fn text(&mut self, raw: &str) {
        if !self.in_head && !raw.is_empty() {
            self.out.text(&decode_entities(raw), self.pre > 0);
        }
    }

    /// What starts at a `<`: a comment, a declaration, a tag, or a `<` that
    /// is only text.
    fn markup(&mut self) {
        let rest = &self.html[self.at..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            self.at += 4 + comment.find("-->").map_or(comment.len(), |end| end + 3);
        } else if let Some(cdata) = rest.strip_prefix("<![CDATA[") {
            let end = cdata.find("]]>").unwrap_or(cdata.len());
            if !self.in_head {
                self.out.text(&cdata[..end], self.pre > 0);
            }
            self.at += 9 + (end + 3).min(cdata.len());
        } else if rest.starts_with("<!") || rest.starts_with("<?") {
            self.at += rest.find('>').map_or(rest.len(), |end| end + 1);
        } else if let Some(tag) = Tag::parse(rest) {
            self.at += tag.len;
            self.tag(&tag);
        } else {
            self.text("<");
            self.at += 1;
        }
    }

    fn tag(&mut self, tag: &Tag) {
        let name = tag.name.as_str();
        if !tag.closing && self.in_head && !HEAD_CONTENT.contains(&name) {
            self.in_head = false;
        }
        match (name, tag.closing) {
            ("head", false) => self.in_head = true,
            ("head", true) | ("body", false) => self.in_head = false,
            ("title", false) => {
                let content = self.skip_to_end_tag("title");
                let title = collapse_whitespace(&decode_entities(content));
                // Only the document's title: an SVG's `<title>` is a tooltip.
                self.title.get_or_insert(title);
            }
            (name, false) if SKIPPED.contains(&name) && !tag.self_closing => {
                self.skip_to_end_tag(name);
            }
            ("pre", false) => {
                self.out.line_break(2);
                self.pre += 1;
                // A newline right after `<pre>` is not content, as in a browser.
                let rest = &self.html[self.at..];
                self.at += if rest.starts_with("\r\n") { 2 } else { usize::from(rest.starts_with('\n')) };
            }
            ("pre", true) => {
                self.out.line_break(2);
                self.pre = self.pre.saturating_sub(1);
            }
            ("br", _) => self.out.hard_break(),
            ("li", false) => {
                self.out.line_break(1);
                self.out.bullet();
            }
            ("td" | "th", false) => self.out.cell(),
            (name, _) if PARAGRAPHS.contains(&name) => self.out.line_break(2),
            (name, _) if LINES.contains(&name) => self.out.line_break(1),
            _ => {}
        }
    }

    /// Skip past the end tag of `name` (or to the end of the input) and
    /// return what was skipped.
    fn skip_to_end_tag(&mut self, name: &str) -> &str {
        let rest = &self.html[self.at..];
        let Some(end) = find_end_tag(rest, name) else {
            self.at = self.html.len();
            return rest;
        };
        let after = &rest[end..];
        self.at += end + after.find('>').map_or(after.len(), |gt| gt + 1);
        &rest[..end]
    }
}

/// Where `</name` starts in `html`, the name compared without regard to case
/// and ended by `>`, `/` or whitespace.
fn find_end_tag(html: &str, name: &str) -> Option<usize> {
    let bytes = html.as_bytes();
    let mut from = 0;
    while let Some(found) = html[from..].find("</") {
        let start = from + found;
        let name_end = start + 2 + name.len();
        let matches = bytes
            .get(start + 2..name_end)
            .is_some_and(|candidate| candidate.eq_ignore_ascii_case(name.as_bytes()));
        let ended = bytes.get(name_end).is_none_or(|&b| b == b'>' || b == b'/' || b.is_ascii_whitespace());
        if matches && ended {
            return Some(start);
        }
        from = start + 2;
    }
    None
}

/// A start or end tag.
struct Tag {
    /// Lowercased.
    name: String,
    closing: bool,
    self_closing: bool,
    /// Bytes from the `<` through the `>`.
    len: usize,
}

impl Tag {
    /// The tag at the start of `html`, if the `<` there opens one: `<` or
    /// `</` then a letter. A tag left open at the end of the input runs to it.
    fn parse(html: &str) -> Option<Tag> {
        let bytes = html.as_bytes();
        let closing = bytes.get(1) == Some(&b'/');
        let name_start = if closing { 2 } else { 1 };
        if !bytes.get(name_start).is_some_and(u8::is_ascii_alphabetic) {
            return None;
        }
        let name_len = bytes[name_start..]
            .iter()
            .take_while(|&&b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b':' | b'_'))
            .count();
        let name = html[name_start..name_start + name_len].to_ascii_lowercase();
        // The tag ends at the first `>` outside a quoted attribute value. A
        // quote opens a value only right after its `=`: in `title=it's` it
        // is part of the value.
        let mut quote = None;
        let mut after_equals = false;
        let mut end = html.len();
        for (at, &byte) in bytes.iter().enumerate().skip(name_start + name_len) {
            match (quote, byte) {
                (Some(open), _) if byte == open => quote = None,
                (Some(_), _) => {}
                (None, b'"' | b'\'') if after_equals => quote = Some(byte),
                (None, b'>') => {
                    end = at + 1;
                    break;
                }
                _ => {}
            }
            if quote.is_none() && !byte.is_ascii_whitespace() {
                after_equals = byte == b'=';
            }
        }
        let self_closing = html[..end].trim_end_matches('>').ends_with('/');
        Some(Tag { name, closing, self_closing, len: end })
    }
}

/// The text being written, with breaks and spaces held back until text
/// follows them: no trailing spaces, no run of more than one blank line, no
/// break before the first text.
#[derive(Default)]
struct Writer {
    out: String,
    /// Newlines owed before the next text (0, 1 or 2).
    breaks: usize,
    /// A space owed before the next text on the same line.
    space: bool,
    /// A list item's marker owed before its text.
    bullet: bool,
    /// A table cell's separator owed before its text.
    cell: bool,
}

impl Writer {
    fn text(&mut self, text: &str, pre: bool) {
        for c in text.chars() {
            if pre {
                if c == '\n' {
                    self.flush();
                    self.out.push('\n');
                    continue;
                }
            } else if c.is_whitespace() {
                self.space = true;
                continue;
            }
            self.flush();
            self.out.push(c);
        }
    }

    /// Write what is owed before a character of text.
    fn flush(&mut self) {
        let at_line_start = self.out.is_empty() || self.out.ends_with('\n');
        if self.out.is_empty() {
            self.breaks = 0;
        } else if self.breaks > 0 {
            let owed = self.breaks.saturating_sub(trailing_newlines(&self.out));
            self.out.extend(std::iter::repeat_n('\n', owed));
        }
        let at_line_start = at_line_start || self.breaks > 0;
        if self.bullet {
            self.out.push_str("- ");
        } else if self.cell && !at_line_start {
            self.out.push_str(" | ");
        } else if self.space && !at_line_start {
            self.out.push(' ');
        }
        self.breaks = 0;
        self.space = false;
        self.bullet = false;
        self.cell = false;
    }

    /// End the line, leaving `lines - 1` blank lines (at most one) before
    /// the next text.
    fn line_break(&mut self, lines: usize) {
        self.breaks = self.breaks.max(lines);
        self.space = false;
    }

    /// A `<br>`: a line break that adds to those before it, so `<br><br>`
    /// leaves a blank line.
    fn hard_break(&mut self) {
        if self.out.is_empty() {
            return;
        }
        let pending = self.breaks.max(trailing_newlines(&self.out));
        self.breaks = (pending + 1).min(2);
        self.space = false;
    }

    fn bullet(&mut self) {
        self.bullet = true;
    }

    fn cell(&mut self) {
        self.cell = true;
    }

    fn finish(self) -> String {
        let lines: Vec<&str> = self.out.lines().map(str::trim_end).collect();
        lines.join("\n").trim().to_string()
    }
}

fn trailing_newlines(text: &str) -> usize {
    text.bytes().rev().take_while(|&b| b == b'\n').count()
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Decode character references: the named ones pages use most and every
/// numeric one. An unknown or unterminated reference is left as written, as
/// is a number that names no character.
pub fn decode_entities(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains('&') {
        return text.into();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        rest = &rest[amp..];
        // The longest reference decoded is `&#x10FFFF;`: the `;` is looked
        // for that far only, so a text of many `&` stays linear.
        let end = rest.bytes().skip(1).take(10).position(|b| b == b';');
        let reference = end.map(|end| &rest[1..=end]);
        match reference.and_then(entity) {
            Some(c) => {
                out.push(c);
                rest = &rest[reference.map_or(0, str::len) + 2..];
            }
            None => {
                out.push('&');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    out.into()
}

/// The character `name` (what is between `&` and `;`) stands for.
fn entity(name: &str) -> Option<char> {
    if let Some(number) = name.strip_prefix('#') {
        let code = match number.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => number.parse().ok()?,
        };
        // A reference to NUL or a surrogate is an error a browser shows as
        // the replacement character.
        return Some(match code {
            0 => '\u{FFFD}',
            code => char::from_u32(code).unwrap_or('\u{FFFD}'),
        });
    }
    Some(match name {
        "amp" => '&',
        "lt" => '<',
        "gt" => '>',
        "quot" => '"',
        "apos" => '\'',
        // Collapsed with the spaces around it: the model reads words, not a layout.
        "nbsp" => ' ',
        "ndash" => '–',
        "mdash" => '—',
        "hellip" => '…',
        "lsquo" => '‘',
        "rsquo" => '’',
        "ldquo" => '“',
        "rdquo" => '”',
        "laquo" => '«',
        "raquo" => '»',
        "bull" => '•',
        "middot" => '·',
        "copy" => '©',
        "reg" => '®',
        "trade" => '™',
        "deg" => '°',
        "times" => '×',
        "euro" => '€',
        "pound" => '£',
        "yen" => '¥',
        "cent" => '¢',
        "sect" => '§',
        "para" => '¶',
        "shy" => '\u{AD}',
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_title_as_the_first_line_and_drops_the_rest_of_the_head() {
        let html = "<!DOCTYPE html><html><head><meta charset=utf-8><title> Rust &amp; WASM\n</title>\
                    <style>body { color: red }</style><script>var x = '<p>';</script>\
                    <link rel=stylesheet href=a.css>stray head text</head>\
                    <body><h1>Hello</h1><p>World</p></body></html>";
        assert_eq!(to_text(html), "Rust & WASM\n\nHello\n\nWorld");
    }

    #[test]
    fn drops_scripts_styles_noscript_templates_and_svg_anywhere() {
        let html = "<p>a</p><script type=module>if (a < b) { document.write('</p>') }</script>\
                    <noscript><p>enable JS</p></noscript><STYLE>.x{}</STYLE>b\
                    <template><p>hidden</p></template><svg><title>icon</title><path d=''/></svg>c\
                    <script src=x.js></script>d";
        assert_eq!(to_text(html), "a\n\nbcd");
    }

    #[test]
    fn a_script_ends_only_at_its_own_end_tag() {
        assert_eq!(to_text("x<script>let s = '</scripts>'; </p></script>y"), "xy");
        assert_eq!(to_text("x<script>never closed <p>text</p>"), "x");
        assert_eq!(to_text("x<ScRiPt>a</SCRIPT >y"), "xy");
    }

    #[test]
    fn block_elements_and_br_become_line_breaks() {
        let html = "<div>one</div><div>two<br>three<br><br>four</div><p>para</p><p>graph</p>\
                    <h2>Head</h2>tail<hr>end";
        assert_eq!(to_text(html), "one\ntwo\nthree\n\nfour\n\npara\n\ngraph\n\nHead\n\ntail\n\nend");
    }

    #[test]
    fn collapses_whitespace_as_a_browser_does() {
        let html = "<p>  lots\n\tof   <b>spaced</b>\n   words  </p>\n\n\n   <p>\n next </p>";
        assert_eq!(to_text(html), "lots of spaced words\n\nnext");
        assert_eq!(to_text("a<b>b</b>c <i> d</i>"), "abc d");
        assert_eq!(to_text("   \n  "), "");
    }

    #[test]
    fn keeps_link_text_and_drops_the_markup_around_it() {
        let html = r#"<p>See <a href="https://example.com/?a=1&amp;b=2" title='x > y'>the docs</a>.</p>"#;
        assert_eq!(to_text(html), "See the docs.");
        let html = r#"<p><a title=it's href = "a>b">it's</a> here</p>"#;
        assert_eq!(to_text(html), "it's here", "a quote inside an unquoted value opens nothing");
    }

    #[test]
    fn decodes_named_and_numeric_entities() {
        assert_eq!(
            to_text(
                "<p>&amp; &lt;tag&gt; &quot;q&quot; &#39;s&#39; a&nbsp;b &#233; &#xE9; &#X1F600; &mdash;</p>"
            ),
            "& <tag> \"q\" 's' a b é é 😀 —"
        );
        assert_eq!(
            decode_entities("&unknown; &amp &#xZZ; &#0; &#xD800; & alone"),
            "&unknown; &amp &#xZZ; \u{FFFD} \u{FFFD} & alone"
        );
        assert_eq!(decode_entities("&amp;lt;"), "&lt;", "decoded once");
        assert_eq!(decode_entities("plain"), "plain");
        assert_eq!(decode_entities("&averyverylongname; &#x10FFFF;"), "&averyverylongname; \u{10FFFF}");
    }

    #[test]
    fn lists_get_a_marker_and_table_cells_a_separator() {
        let html = "<ul><li>one</li><li><p>two</p></li></ul><table><tr><th>k</th><th>v</th></tr>\
                    <tr><td>a</td><td>1</td></tr></table>";
        assert_eq!(to_text(html), "- one\n\n- two\n\nk | v\na | 1");
    }

    #[test]
    fn keeps_whitespace_inside_pre() {
        let html = "<p>code:</p><pre>\nfn main() {\n    println!(\"&lt;hi&gt;\");\n}</pre><p>after</p>";
        assert_eq!(to_text(html), "code:\n\nfn main() {\n    println!(\"<hi>\");\n}\n\nafter");
    }

    #[test]
    fn comments_doctypes_and_cdata() {
        let html = "<!doctype html><!-- <p>hidden</p> -->a<?xml version='1.0'?>b<![CDATA[<c>]]>d<!-- open";
        assert_eq!(to_text(html), "ab<c>d");
    }

    #[test]
    fn stray_angle_brackets_are_text() {
        assert_eq!(to_text("<p>1 < 2 and 3 > 2, a <= b, x<3</p>"), "1 < 2 and 3 > 2, a <= b, x<3");
        assert_eq!(to_text("a </ b"), "a </ b");
        assert_eq!(to_text("unclosed <a href='x"), "unclosed");
    }

    #[test]
    fn a_head_without_its_end_tag_ends_at_the_first_body_element() {
        let html = "<html><head><title>T</title><div>shown</div>";
        assert_eq!(to_text(html), "T\n\nshown");
        assert_eq!(to_text("<title>Only a title</title>"), "Only a title");
    }

    #[test]
    fn a_document_without_markup_is_its_text() {
        assert_eq!(to_text("just words,\n  spaced"), "just words, spaced");
        assert_eq!(to_text(""), "");
    }
}
