//! A strict scanner for the plain layout of one OTLP-JSON `TracesData` line.
//!
//! Usage (inside the crate):
//!
//!     let mut recent = scan::Recent::default();    // attribute lists seen lately
//!     if let Some(groups) = scan::line(bytes, &mut recent) { /* each group: resource, spans */ }
//!     if let Some((groups, end)) = scan::object(block_text, at, &mut recent) { /* a line */ }
//!     if let Some(pairs) = scan::pairs(list_text, |key| slots.get(key)) { /* an attribute list */ }
//!
//! It reads the fields the rows need in one pass over the bytes, without building values for
//! the rest, and checks everything it passes over against the JSON grammar. It answers `None`
//! for anything it does not take (escapes in keys, ids or names; `\u` escapes anywhere; control
//! characters anywhere, whitespace included; long or exponent numbers; a repeated field; a null
//! where the layout has a value; invalid UTF-8) and the caller reads the line with the general
//! parser, which gives the rows or hands the line on. So a line it takes is valid JSON with
//! exactly the fields the general parser would give; the one value it only delimits (a span's
//! attribute list, `raw_unchecked`) is parsed by its consumer or equals a list that was.

use std::borrow::Cow;

/// The fields of one span, as the row needs them: values still to decode (times, attribute
/// list) are the raw JSON text.
pub struct SpanFields<'a> {
    pub trace_id: Cow<'a, str>,
    pub span_id: Cow<'a, str>,
    pub parent_id: Option<Cow<'a, str>>,
    pub name: Option<Cow<'a, str>>,
    pub start: &'a [u8],
    pub end: &'a [u8],
    pub attributes: &'a [u8], // "null" where missing
}

/// One `ResourceSpans`: its resource's raw JSON ("null" where missing) and the spans of all
/// its scopes, in order.
pub struct Group<'a> {
    pub resource: &'a [u8],
    pub spans: Vec<SpanFields<'a>>,
}

pub const NULL: &[u8] = b"null";
const DEPTH: u32 = 64; // deeper values go to the general parser
const DIGITS_MAX: usize = 15; // longer skipped numbers too: parsers differ on their range

/// The attribute lists the scanner delimited last, most recent first: a span's list that
/// begins with one of them is that list (an array ends at its closing bracket, so a complete
/// list at the start of the text is the whole value), taken by one comparison instead of a
/// walk over its brackets and strings. The spans of a step repeat a few lists (an op's, a
/// collective's parts'): nine in ten are one of the last few.
#[derive(Default)]
pub struct Recent {
    lists: Vec<Vec<u8>>,
    /// lists taken by comparison
    pub hits: u64,
}

impl Recent {
    const KEPT: usize = 4;

    /// The length of the recent list `text` begins with (it moves to the front).
    fn find(&mut self, text: &[u8]) -> Option<usize> {
        let at = self.lists.iter().position(|list| text.starts_with(list))?;
        self.lists[..=at].rotate_right(1);
        self.hits += 1;
        Some(self.lists[0].len())
    }

    fn push(&mut self, list: &[u8]) {
        let mut kept = if self.lists.len() == Self::KEPT {
            self.lists.pop().unwrap_or_default() // its allocation reused
        } else {
            Vec::new()
        };
        kept.clear();
        kept.extend_from_slice(list);
        self.lists.insert(0, kept);
    }
}

/// An attribute value of one scalar kind, as its JSON text.
pub enum RawScalar<'a> {
    Str(&'a str),
    Int(&'a [u8]), // a string or a number: `time_ns` reads it
    Bool(bool),
    Double(&'a str),
}

/// The pairs of an attribute list in the plain layout (`[{"key":"k","value":{"intValue":"3"}},
/// ...]`) whose key has a `slot`, in order, each with that slot and its value (None where the
/// pair has no `value`); the others are checked and skipped. None for anything else (a value
/// of another kind or of two kinds, an unknown field, a repeated one, escapes in a key or a
/// wanted string): the general parser decides, and where this answers it answers as that does.
pub fn pairs<'a, T>(
    text: &'a str,
    slot: impl Fn(&str) -> Option<T>,
) -> Option<Vec<(T, &'a str, Option<RawScalar<'a>>)>> {
    let mut cursor = Cursor {
        text,
        at: 0,
        recent: None,
    };
    let mut found = Vec::new();
    cursor.elements(|cursor| {
        let mut key: Option<(&'a str, Option<T>)> = None;
        let mut value: Option<Option<RawScalar<'a>>> = None;
        cursor.members(|cursor, field| match field {
            "key" => {
                let text = cursor.plain()?;
                once(&mut key, (text, slot(text)))
            }
            "value" => match &key {
                Some((_, None)) => once(&mut value, cursor.skip_value(DEPTH).map(|_| None)?),
                Some((_, Some(_))) => once(&mut value, Some(cursor.scalar()?)),
                None => None, // the key after its value: the general parser
            },
            _ => None,
        })?;
        if let (text, Some(slot)) = key? {
            found.push((slot, text, value.flatten()));
        }
        Some(())
    })?;
    cursor.space();
    (cursor.at == text.len()).then_some(found)
}

/// The groups of a line in the plain layout, or None: the general parser decides.
pub fn line<'a>(bytes: &'a [u8], recent: &mut Recent) -> Option<Vec<Group<'a>>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let (groups, end) = object(text, 0, recent)?;
    (end == bytes.len()).then_some(groups) // else trailing bytes
}

/// The groups of the `TracesData` object at `text[at..]` (after spaces) and where it ends,
/// spaces after it included; None: the general parser decides. `text` may go on (a block of
/// lines): the object's end is found, not assumed.
pub fn object<'a>(
    text: &'a str,
    at: usize,
    recent: &mut Recent,
) -> Option<(Vec<Group<'a>>, usize)> {
    let mut cursor = Cursor {
        text,
        at,
        recent: Some(recent),
    };
    let mut groups: Option<Vec<Group>> = None;
    cursor.members(|cursor, key| match key {
        "resourceSpans" => {
            let mut list = Vec::new();
            cursor.elements(|cursor| {
                list.push(cursor.group()?);
                Some(())
            })?;
            once(&mut groups, list)
        }
        _ => cursor.skip_value(DEPTH),
    })?;
    cursor.space();
    Some((groups.filter(|list| !list.is_empty())?, cursor.at))
}

/// The index of the first `"`, `\\` or control character in `bytes`: sixteen bytes a step
/// with SSE2 (every x86-64 has it), else eight (`string_stop_swar`).
#[cfg(target_arch = "x86_64")]
fn string_stop(bytes: &[u8]) -> Option<usize> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    let mut at = 0;
    // SAFETY: SSE2 is part of the x86-64 baseline; each load reads 16 bytes inside `bytes`
    unsafe {
        let quotes = _mm_set1_epi8(b'"' as i8);
        let escapes = _mm_set1_epi8(b'\\' as i8);
        let below = _mm_set1_epi8(0x1f);
        while at + 16 <= bytes.len() {
            let chunk = _mm_loadu_si128(bytes.as_ptr().add(at) as *const __m128i);
            // a byte <= 0x1f is one whose unsigned max with 0x1f is 0x1f
            let control = _mm_cmpeq_epi8(_mm_max_epu8(chunk, below), below);
            let found = _mm_or_si128(
                _mm_or_si128(
                    _mm_cmpeq_epi8(chunk, quotes),
                    _mm_cmpeq_epi8(chunk, escapes),
                ),
                control,
            );
            let mask = _mm_movemask_epi8(found);
            if mask != 0 {
                return Some(at + mask.trailing_zeros() as usize);
            }
            at += 16;
        }
    }
    string_stop_swar(&bytes[at..]).map(|found| at + found)
}

#[cfg(not(target_arch = "x86_64"))]
fn string_stop(bytes: &[u8]) -> Option<usize> {
    string_stop_swar(bytes)
}

/// `string_stop` eight bytes a step.
fn string_stop_swar(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = ONES * b'"' as u64;
    const ESCAPES: u64 = ONES * b'\\' as u64;
    const SPACES: u64 = ONES * 0x20;
    let mut at = 0;
    while let Some(chunk) = bytes.get(at..at + 8) {
        let word = u64::from_le_bytes(chunk.try_into().ok()?);
        let (quotes, escapes) = (word ^ QUOTES, word ^ ESCAPES);
        // a zero byte in either, or a byte below 0x20: its high bit set (the lowest is exact)
        let found = ((quotes.wrapping_sub(ONES) & !quotes)
            | (escapes.wrapping_sub(ONES) & !escapes)
            | (word.wrapping_sub(SPACES) & !word))
            & HIGHS;
        if found != 0 {
            return Some(at + (found.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    let tail = bytes[at..]
        .iter()
        .position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20)?;
    Some(at + tail)
}

fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None; // a repeated field: the general parser refuses it
    }
    *slot = Some(value);
    Some(())
}

struct Cursor<'a, 'r> {
    text: &'a str,
    at: usize,
    recent: Option<&'r mut Recent>, // attribute lists delimited lately (`raw_unchecked`)
}

impl<'a> Cursor<'a, '_> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn space(&mut self) {
        // tabs, CR and LF: the general parser (never in the plain layout)
        while self.bytes().get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.space();
        self.bytes().get(self.at).copied()
    }

    fn eat(&mut self, byte: u8) -> bool {
        if self.peek() == Some(byte) {
            self.at += 1;
            return true;
        }
        false
    }

    /// An object's members: `each(cursor, key)` reads the value.
    fn members(&mut self, mut each: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        if !self.eat(b'{') {
            return None;
        }
        if self.eat(b'}') {
            return Some(());
        }
        loop {
            let key = self.plain()?;
            if !self.eat(b':') {
                return None;
            }
            each(self, key)?;
            if self.eat(b',') {
                continue;
            }
            return self.eat(b'}').then_some(());
        }
    }

    /// An array's elements: `each(cursor)` reads one.
    fn elements(&mut self, mut each: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if !self.eat(b'[') {
            return None;
        }
        if self.eat(b']') {
            return Some(());
        }
        loop {
            each(self)?;
            if self.eat(b',') {
                continue;
            }
            return self.eat(b']').then_some(());
        }
    }

    /// A string without escapes: its text.
    fn plain(&mut self) -> Option<&'a str> {
        if !self.eat(b'"') {
            return None;
        }
        let start = self.at;
        let length = string_stop(&self.bytes()[start..])?;
        if self.bytes()[start + length] != b'"' {
            return None;
        }
        self.at = start + length + 1;
        self.text.get(start..start + length) // both ends next to ASCII quotes
    }

    fn plain_cow(&mut self) -> Option<Cow<'a, str>> {
        self.plain().map(Cow::Borrowed)
    }

    /// Any value's raw text.
    fn raw(&mut self) -> Option<&'a [u8]> {
        self.space();
        let start = self.at;
        self.skip_value(DEPTH)?;
        Some(&self.bytes()[start..self.at])
    }

    /// A value's raw text by its brackets and strings alone, not checked against the grammar:
    /// for values whose consumer parses them, or meets them only as the key of one it parsed
    /// (an attribute list: the tail cache, else the attribute parser). A scalar is read as
    /// `raw` reads it.
    fn raw_unchecked(&mut self) -> Option<&'a [u8]> {
        if !matches!(self.peek()?, b'[' | b'{') {
            return self.raw();
        }
        let bytes = self.bytes();
        let start = self.at;
        if let Some(length) = self.recent.as_mut().and_then(|r| r.find(&bytes[start..])) {
            self.at = start + length;
            return Some(&bytes[start..self.at]);
        }
        let mut depth = 0u32;
        let mut at = start;
        loop {
            match *bytes.get(at)? {
                b'[' | b'{' => depth += 1,
                b']' | b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        self.at = at + 1;
                        if let Some(recent) = self.recent.as_mut() {
                            recent.push(&bytes[start..self.at]);
                        }
                        return Some(&bytes[start..self.at]);
                    }
                }
                b'"' => loop {
                    // to the closing quote, over escaped characters
                    at += 1 + string_stop(&bytes[at + 1..])?;
                    match bytes[at] {
                        b'"' => break,
                        b'\\' => at += 1,
                        _ => return None, // a control character
                    }
                },
                _ => {}
            }
            at += 1;
        }
    }

    fn skip_value(&mut self, depth: u32) -> Option<()> {
        match self.peek()? {
            b'"' => self.skip_string(),
            b'{' if depth > 0 => self.members(|cursor, _| cursor.skip_value(depth - 1)),
            b'[' if depth > 0 => self.elements(|cursor| cursor.skip_value(depth - 1)),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.skip_number(),
            _ => None,
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.at + word.len();
        (self.bytes().get(self.at..end)? == word).then(|| self.at = end)
    }

    /// A string with the short escapes; `\u` (surrogates, which parsers treat differently)
    /// goes to the general parser.
    fn skip_string(&mut self) -> Option<()> {
        if !self.eat(b'"') {
            return None;
        }
        loop {
            let rest = &self.bytes()[self.at..];
            let length = string_stop(rest)?;
            self.at += length + 1;
            if rest[length] == b'"' {
                return Some(());
            }
            if rest[length] != b'\\' {
                return None; // a control character
            }
            match *rest.get(length + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => self.at += 1,
                _ => return None,
            }
        }
    }

    /// A number by the JSON grammar, short and without an exponent.
    fn skip_number(&mut self) -> Option<()> {
        let bytes = self.bytes();
        let start = self.at;
        let mut at = start;
        if bytes.get(at) == Some(&b'-') {
            at += 1;
        }
        let digits = |at: usize| {
            bytes[at..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count()
        };
        let whole = digits(at);
        if whole == 0 || (whole > 1 && bytes[at] == b'0') {
            return None;
        }
        at += whole;
        if bytes.get(at) == Some(&b'.') {
            let fraction = digits(at + 1);
            if fraction == 0 {
                return None;
            }
            at += 1 + fraction;
        }
        if matches!(bytes.get(at), Some(b'e' | b'E')) || at - start > DIGITS_MAX {
            return None;
        }
        self.at = at;
        Some(())
    }

    /// `{"stringValue":"..."}`, `{"intValue":...}`, `{"boolValue":...}` or
    /// `{"doubleValue":...}`: one kind, nothing else in the object.
    fn scalar(&mut self) -> Option<RawScalar<'a>> {
        let mut value = None;
        self.members(|cursor, kind| {
            let read = match kind {
                "stringValue" => RawScalar::Str(cursor.plain()?),
                "intValue" => RawScalar::Int(cursor.raw_scalar()?),
                "boolValue" => match cursor.peek()? {
                    b't' => cursor.literal(b"true").map(|_| RawScalar::Bool(true))?,
                    _ => cursor.literal(b"false").map(|_| RawScalar::Bool(false))?,
                },
                "doubleValue" => {
                    cursor.space();
                    let start = cursor.at;
                    cursor.skip_number()?;
                    RawScalar::Double(cursor.text.get(start..cursor.at)?)
                }
                _ => return None,
            };
            once(&mut value, read)
        })?;
        value
    }

    /// A plain string with its quotes, or a number: an integer's text.
    fn raw_scalar(&mut self) -> Option<&'a [u8]> {
        self.space();
        let start = self.at;
        match self.peek()? {
            b'"' => {
                self.plain()?;
            }
            b'-' | b'0'..=b'9' => self.skip_number()?,
            _ => return None,
        }
        Some(&self.bytes()[start..self.at])
    }

    fn group(&mut self) -> Option<Group<'a>> {
        let mut resource: Option<&'a [u8]> = None;
        let mut spans: Option<Vec<SpanFields<'a>>> = None;
        self.members(|cursor, key| match key {
            "resource" => once(&mut resource, cursor.raw()?),
            "scopeSpans" => {
                let mut list = Vec::new();
                cursor.elements(|cursor| cursor.scope(&mut list))?;
                once(&mut spans, list)
            }
            _ => cursor.skip_value(DEPTH),
        })?;
        Some(Group {
            resource: resource.unwrap_or(NULL),
            spans: spans?,
        })
    }

    fn scope(&mut self, list: &mut Vec<SpanFields<'a>>) -> Option<()> {
        let mut seen = false;
        self.members(|cursor, key| match key {
            "spans" if !seen => {
                seen = true;
                cursor.elements(|cursor| {
                    list.push(cursor.span()?);
                    Some(())
                })
            }
            "spans" => None, // repeated
            _ => cursor.skip_value(DEPTH),
        })
    }

    fn span(&mut self) -> Option<SpanFields<'a>> {
        let mut trace_id = None;
        let mut span_id = None;
        let mut parent_id = None;
        let mut name = None;
        let mut start = None;
        let mut end = None;
        let mut attributes = None;
        self.members(|cursor, key| match key {
            "traceId" => once(&mut trace_id, cursor.plain_cow()?),
            "spanId" => once(&mut span_id, cursor.plain_cow()?),
            "parentSpanId" => once(&mut parent_id, cursor.plain_cow()?),
            "name" => once(&mut name, cursor.plain_cow()?),
            "startTimeUnixNano" => once(&mut start, cursor.raw()?),
            "endTimeUnixNano" => once(&mut end, cursor.raw()?),
            "attributes" => once(&mut attributes, cursor.raw_unchecked()?),
            _ => cursor.skip_value(DEPTH),
        })?;
        Some(SpanFields {
            trace_id: trace_id?,
            span_id: span_id?,
            parent_id,
            name: Some(name.unwrap_or(Cow::Borrowed(""))),
            start: start?,
            end: end?,
            attributes: attributes.unwrap_or(NULL),
        })
    }
}
