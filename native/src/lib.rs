//! tf_otel_native: the OTLP-JSON line decoder of `tf-otel analyze`, in Rust.
//!
//! Usage (from Python; `tf_otel.analysis.load.otlp_native` wraps it):
//!
//!     decoder = tf_otel_native.LineDecoder(helper, slot_keys, kept_keys)
//!     rows = decoder.decode(data, begin, end)   # data[begin:end]: one TracesData line
//!
//! It gives the same rows (`tf_otel.analysis.model.Row`) as the generic Python path for the
//! plain layout that `TF_OTEL_FILE` and the OTLP file exporter write, and `None` for anything
//! else (other spellings, nulls where values belong, ids that are not plain hex, times that are
//! not plain integers, invalid JSON, ...): the caller decodes that line again on the generic
//! path, which gives the rows or names the error. What needs the analysis' own rules (resource
//! attributes, which span attributes are kept and how their values decode, ids in base64) is
//! asked of `helper` once per distinct value and cached here; the per-span work (parsing,
//! ids, times, the row fields of plain attribute lists, the row tuple) makes no Python call.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyDict, PyFloat, PyList, PyString, PyTuple};
use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use sonic_rs::LazyValue;
use std::borrow::Cow;
use std::cell::Cell;
use std::marker::PhantomData;

mod scan;
mod spill;
use scan::{Group, SpanFields, NULL};

/// rustc's FxHash: the cache keys are attribute lists of a few hundred bytes looked up once a
/// span; SipHash's flooding resistance buys nothing for one process' own input and cost about a
/// tenth of the decoding.
type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// A struct read from a JSON object only: serde's derive also takes a struct from an array of
/// its fields in order (`[[]]` is a `ScopeSpans` with every field missing), which the generic
/// path rejects. `deserialize_map` refuses an array; the object is handed to the derived code.
struct AsMap<T>(T);

struct MapOnly<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
    type Value = T;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for AsMap<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_map(MapOnly(PhantomData))
            .map(AsMap)
    }
}

#[derive(Deserialize)]
struct TracesData<'a> {
    #[serde(rename = "resourceSpans", borrow, default)]
    resource_spans: Option<Vec<AsMap<ResourceSpans<'a>>>>,
}

#[derive(Deserialize)]
struct ResourceSpans<'a> {
    #[serde(borrow, default)]
    resource: Option<LazyValue<'a>>,
    #[serde(rename = "scopeSpans", borrow, default)]
    scope_spans: Option<Vec<AsMap<ScopeSpans<'a>>>>,
}

#[derive(Deserialize)]
struct ScopeSpans<'a> {
    #[serde(borrow, default)]
    spans: Option<Vec<AsMap<SpanIn<'a>>>>,
}

fn empty_name<'a>() -> Option<Cow<'a, str>> {
    Some(Cow::Borrowed(""))
}

#[derive(Deserialize)]
struct SpanIn<'a> {
    #[serde(rename = "traceId", borrow)]
    trace_id: Cow<'a, str>,
    #[serde(rename = "spanId", borrow)]
    span_id: Cow<'a, str>,
    #[serde(rename = "parentSpanId", borrow, default)]
    parent_id: Option<Cow<'a, str>>,
    // missing: "" (as the generic path's `raw.get("name", "")`); null: None
    #[serde(borrow, default = "empty_name")]
    name: Option<Cow<'a, str>>,
    #[serde(rename = "startTimeUnixNano", borrow)]
    start: LazyValue<'a>,
    #[serde(rename = "endTimeUnixNano", borrow)]
    end: LazyValue<'a>,
    #[serde(borrow, default)]
    attributes: Option<LazyValue<'a>>,
}

#[derive(Deserialize)]
struct Pair<'a> {
    #[serde(borrow)]
    key: Cow<'a, str>,
    #[serde(borrow, default)]
    value: Option<LazyValue<'a>>,
}

/// An `AnyValue` of one scalar kind; any other key (arrayValue, kvlistValue, bytesValue, a
/// second kind) fails it, and the helper decides.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScalarIn<'a> {
    #[serde(rename = "stringValue", borrow, default)]
    string: Option<Cow<'a, str>>,
    #[serde(rename = "intValue", borrow, default)]
    int: Option<LazyValue<'a>>,
    #[serde(rename = "boolValue", default)]
    boolean: Option<bool>,
    // its text, read by Rust's parser as the scanner's is: sonic-rs reads -0.0 as 0.0
    #[serde(rename = "doubleValue", borrow, default)]
    double: Option<LazyValue<'a>>,
}

enum Scalar<'a> {
    Str(Cow<'a, str>),
    Int(i64),
    Bool(bool),
    Double(f64),
}

impl Scalar<'_> {
    fn to_object<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Scalar::Str(text) => PyString::new(py, text).into_any(),
            Scalar::Int(value) => value.into_pyobject(py)?.into_any(),
            Scalar::Bool(value) => PyBool::new(py, *value).to_owned().into_any(),
            Scalar::Double(value) => PyFloat::new(py, *value).into_any(),
        })
    }
}

/// One attribute's value, where it is a plain scalar (else the helper decides the list).
fn scalar<'a>(raw: &'a LazyValue<'a>) -> Option<Scalar<'a>> {
    let AsMap(value) = sonic_rs::from_str::<AsMap<ScalarIn>>(raw.as_raw_str()).ok()?;
    match (value.string, value.int, value.boolean, value.double) {
        (Some(text), None, None, None) => Some(Scalar::Str(text)),
        (None, Some(int), None, None) => time_ns(int.as_raw_str().as_bytes()).ok().map(Scalar::Int),
        (None, None, Some(flag), None) => Some(Scalar::Bool(flag)),
        (None, None, None, Some(double)) => double_value(double.as_raw_str()),
        _ => None,
    }
}

/// A finite double from a JSON number's text (a string or any other value: None).
fn double_value(text: &str) -> Option<Scalar<'static>> {
    let value = text.parse::<f64>().ok()?;
    value.is_finite().then_some(Scalar::Double(value))
}

/// The scanner's scalar as the general parser reads it (`scalar`).
fn raw_scalar(raw: scan::RawScalar<'_>) -> Option<Scalar<'_>> {
    match raw {
        scan::RawScalar::Str(text) => Some(Scalar::Str(Cow::Borrowed(text))),
        scan::RawScalar::Int(text) => time_ns(text).ok().map(Scalar::Int),
        scan::RawScalar::Bool(flag) => Some(Scalar::Bool(flag)),
        scan::RawScalar::Double(text) => double_value(text),
    }
}

/// Why a line goes back to the generic path: the helper's exception, if it raised one.
struct Bail(Option<PyErr>);

const BAIL: Bail = Bail(None);

impl From<std::convert::Infallible> for Bail {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<PyErr> for Bail {
    fn from(err: PyErr) -> Self {
        Bail(Some(err))
    }
}

// Bounds on what is remembered per input (an input is one file or part of one); a full cache
// is emptied: the rows do not depend on what is cached.
const RESOURCES_MAX: usize = 64;
const TAILS_MAX: usize = 4096;
const STRINGS_MAX: usize = 200_000;

/// A time: a JSON integer or a string of one, within 64 bits; anything else bails.
fn time_ns(raw: &[u8]) -> Result<i64, Bail> {
    let mut text = raw;
    if text.len() >= 2 && text[0] == b'"' && text[text.len() - 1] == b'"' {
        text = &text[1..text.len() - 1];
    }
    let (negative, digits) = match text.first() {
        Some(b'-') => (true, &text[1..]),
        _ => (false, text),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(BAIL);
    }
    let mut value: i64 = 0;
    for digit in digits {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(i64::from(digit - b'0')))
            .ok_or(BAIL)?;
    }
    Ok(if negative { -value } else { value })
}

/// A hex id of `2 * size` ASCII letters and digits, lowercased ("" for all zeros, as
/// `normalise_id(...) or ""`); None where `rows.normalise_id` must decide (base64, other
/// lengths, non-ASCII).
fn plain_id(text: &str, size: usize) -> Option<String> {
    let bytes = text.as_bytes();
    if bytes.len() != 2 * size || !bytes.iter().all(u8::is_ascii_alphanumeric) {
        return None;
    }
    let lower = text.to_ascii_lowercase();
    if lower.bytes().all(|b| b == b'0') {
        return Some(String::new());
    }
    Some(lower)
}

/// The attributes the analysis reads: the five row slots (category, rank, step, job, GPU
/// utilisation, in `rows._SLOT_KEYS` order), then the kept ones.
struct Keys {
    slots: FastMap<String, usize>, // key -> its slot, or KEPT
    scanned: Cell<u64>,            // attribute lists the scanner read (`scan::pairs`)
}

const KEPT: usize = 5;

impl Keys {
    /// An attribute list's row tail as `rows.RowBuilder.tail` makes it, where every analysis
    /// attribute is a plain scalar of the type its slot holds; None: the helper decides.
    fn tail<'py>(
        &self,
        py: Python<'py>,
        resource: &Resource,
        raw: &[u8],
    ) -> Result<Option<Bound<'py, PyTuple>>, Bail> {
        let empty = resource.empty.bind(py);
        if raw == NULL {
            return Ok(Some(empty.clone()));
        }
        let Ok(text) = std::str::from_utf8(raw) else {
            return Ok(None);
        };
        // the analysis' pairs: the scanner's reading of the plain layout, else the general
        // parser's; a value that is not one scalar is None (the helper decides)
        let parsed: Vec<AsMap<Pair>>;
        let wanted: Vec<(usize, &str, Option<Scalar>)> =
            match scan::pairs(text, |key| self.slots.get(key).copied()) {
                Some(found) => {
                    self.scanned.set(self.scanned.get() + 1);
                    found
                        .into_iter()
                        .map(|(slot, key, value)| (slot, key, value.and_then(raw_scalar)))
                        .collect()
                }
                None => {
                    let Ok(pairs) = sonic_rs::from_str::<Vec<AsMap<Pair>>>(text) else {
                        return Ok(None);
                    };
                    parsed = pairs;
                    parsed
                        .iter()
                        .filter_map(|AsMap(pair)| {
                            let key = pair.key.as_ref();
                            let slot = *self.slots.get(key)?; // not read: never decoded
                            Some((slot, key, pair.value.as_ref().and_then(scalar)))
                        })
                        .collect()
                }
            };
        let mut slots: [Option<Scalar>; KEPT] = [None, None, None, None, None];
        let mut kept: Vec<(&str, Scalar)> = Vec::new();
        for (slot, key, value) in wanted {
            let Some(value) = value else {
                return Ok(None);
            };
            if slot < KEPT {
                slots[slot] = Some(value); // the last of a repeated key wins
            } else if let Some(found) = kept.iter_mut().find(|(seen, _)| *seen == key) {
                found.1 = value; // ... in its first place
            } else {
                kept.push((key, value));
            }
        }
        let [category, rank, step, job, gpu] = slots;
        let category = match category {
            None => empty.get_item(2)?,
            Some(Scalar::Str(text)) => PyString::new(py, &text).into_any(),
            Some(_) => return Ok(None),
        };
        let rank = match rank {
            None => empty.get_item(3)?, // the resource's
            Some(Scalar::Int(value)) => value.into_pyobject(py)?.into_any(),
            Some(_) => return Ok(None),
        };
        let step = match step {
            None => py.None().into_bound(py),
            Some(Scalar::Int(value)) => value.into_pyobject(py)?.into_any(),
            Some(_) => return Ok(None),
        };
        let job = match job {
            _ if resource.has_job => empty.get_item(5)?,
            None => py.None().into_bound(py),
            Some(Scalar::Str(text)) => PyString::new(py, &text).into_any(),
            Some(_) => return Ok(None),
        };
        let gpu = match gpu {
            None => py.None().into_bound(py),
            Some(value) => value.to_object(py)?,
        };
        let kept_dict = if kept.is_empty() {
            empty.get_item(0)? // the one shared empty dict
        } else {
            let dict = PyDict::new(py);
            for (key, value) in &kept {
                dict.set_item(key, value.to_object(py)?)?;
            }
            dict.into_any()
        };
        let tail = PyTuple::new(
            py,
            [
                kept_dict,
                empty.get_item(1)?,
                category,
                rank,
                step,
                job,
                gpu,
            ],
        )?;
        Ok(Some(tail))
    }
}

/// The general parser's reading of a line, as the scanner gives it.
fn sonic_groups<'a>(data: &'a TracesData<'a>) -> Result<Vec<Group<'a>>, Bail> {
    let resource_spans = match &data.resource_spans {
        Some(list) if !list.is_empty() => list,
        _ => return Err(BAIL), // missing, null or empty: "batches" or not OTLP
    };
    let mut groups = Vec::with_capacity(resource_spans.len());
    for AsMap(group) in resource_spans {
        let scopes = group.scope_spans.as_ref().ok_or(BAIL)?; // maybe instrumentationLibrarySpans
        let mut spans = Vec::new();
        for AsMap(scope) in scopes {
            for AsMap(span) in scope.spans.iter().flatten() {
                spans.push(SpanFields {
                    trace_id: Cow::Borrowed(span.trace_id.as_ref()),
                    span_id: Cow::Borrowed(span.span_id.as_ref()),
                    parent_id: span.parent_id.as_deref().map(Cow::Borrowed),
                    name: span.name.as_deref().map(Cow::Borrowed),
                    start: span.start.as_raw_str().as_bytes(),
                    end: span.end.as_raw_str().as_bytes(),
                    attributes: span
                        .attributes
                        .as_ref()
                        .map_or(NULL, |r| r.as_raw_str().as_bytes()),
                });
            }
        }
        groups.push(Group {
            resource: group
                .resource
                .as_ref()
                .map_or(NULL, |r| r.as_raw_str().as_bytes()),
            spans,
        });
    }
    Ok(groups)
}

/// The rows (`model.Row` tuples) of spans' parts.
fn make_rows(py: Python<'_>, spans: Vec<Parts>) -> Result<Bound<'_, PyList>, Bail> {
    let rows = PyList::empty(py);
    for parts in spans {
        let tail = parts.tail.bind(py);
        let kept = tail.get_item(0)?;
        // kept attributes: each span its own dict
        let kept = match kept.cast::<PyDict>() {
            Ok(dict) if !dict.is_empty() => dict.copy()?.into_any(),
            _ => kept,
        };
        let row = PyTuple::new(
            py,
            [
                parts.trace.bind(py).clone().into_any(),
                PyString::new(py, &parts.span_id).into_any(),
                match &parts.parent {
                    Some(p) => p.bind(py).clone().into_any(),
                    None => py.None().into_bound(py),
                },
                match &parts.name {
                    Some(n) => n.bind(py).clone().into_any(),
                    None => py.None().into_bound(py),
                },
                parts.start.into_pyobject(py)?.into_any(),
                parts.end.into_pyobject(py)?.into_any(),
                kept,
                tail.get_item(1)?,
                tail.get_item(2)?,
                tail.get_item(3)?,
                tail.get_item(4)?,
                tail.get_item(5)?,
                tail.get_item(6)?,
            ],
        )?;
        rows.append(row)?;
    }
    Ok(rows)
}

/// One span's row, its Python parts (`LineDecoder::span_parts`).
pub struct Parts {
    pub trace: Py<PyString>,
    pub span_id: String,
    pub parent: Option<Py<PyString>>,
    pub name: Option<Py<PyString>>,
    pub start: i64,
    pub end: i64,
    pub tail: Py<PyTuple>, // the row's last seven fields (`rows.RowTail`)
}

struct Resource {
    attributes: Py<PyDict>,
    // the tail of a span with no attributes: the resource's rank and job, the shared empty dict
    empty: Py<PyTuple>,
    has_job: bool, // the resource names the job: it wins over the span's
    // an attribute list's bytes -> the row's last seven fields (`rows.RowTail`)
    tails: FastMap<Vec<u8>, Py<PyTuple>>,
    // the lists of `tails` met last, most recent first: compared before the map is hashed
    recent: Vec<(Vec<u8>, Py<PyTuple>)>,
}

const RECENT_TAILS: usize = 4;

impl Resource {
    /// The tail of a list among the last few met (it moves to the front).
    fn recent_tail(&mut self, py: Python<'_>, list: &[u8]) -> Option<Py<PyTuple>> {
        let at = self
            .recent
            .iter()
            .position(|(bytes, _)| bytes.as_slice() == list)?;
        self.recent[..=at].rotate_right(1);
        Some(self.recent[0].1.clone_ref(py))
    }

    fn remember(&mut self, py: Python<'_>, list: &[u8], tail: &Py<PyTuple>) {
        if self.recent.len() == RECENT_TAILS {
            self.recent.pop();
        }
        self.recent.insert(0, (list.to_vec(), tail.clone_ref(py)));
    }
}

#[pyclass(module = "tf_otel_native", unsendable)]
struct LineDecoder {
    helper: Py<PyAny>,
    resources: FastMap<Vec<u8>, Resource>,
    trace_ids: FastMap<String, Py<PyString>>,
    parent_ids: FastMap<String, Option<Py<PyString>>>,
    names: FastMap<String, Py<PyString>>,
    keys: Keys,
    recent: scan::Recent, // the attribute lists the scanner met last
    /// lines handed back to the generic path
    #[pyo3(get)]
    bailed: u64,
    /// lines read by the scanner (the plain layout); the others by the general parser
    #[pyo3(get)]
    scanned: u64,
}

impl LineDecoder {
    /// A trace id as `normalise_id(raw, 16) or ""`, cached.
    fn trace_id(&mut self, py: Python<'_>, raw: &str) -> Result<Py<PyString>, Bail> {
        if let Some(found) = self.trace_ids.get(raw) {
            return Ok(found.clone_ref(py));
        }
        let made = match plain_id(raw, 16) {
            Some(text) => PyString::new(py, &text).unbind(),
            None => match self.normalise(py, raw, 16)? {
                Some(text) => text,
                None => PyString::new(py, "").unbind(),
            },
        };
        if self.trace_ids.len() >= STRINGS_MAX {
            self.trace_ids.clear();
        }
        self.trace_ids.insert(raw.to_owned(), made.clone_ref(py));
        Ok(made)
    }

    /// A parent id as `normalise_id(raw, 8)` (None: zeros), cached.
    fn parent_id(&mut self, py: Python<'_>, raw: &str) -> Result<Option<Py<PyString>>, Bail> {
        if let Some(found) = self.parent_ids.get(raw) {
            return Ok(found.as_ref().map(|s| s.clone_ref(py)));
        }
        let made = match plain_id(raw, 8) {
            Some(text) if text.is_empty() => None,
            Some(text) => Some(PyString::new(py, &text).unbind()),
            None => self.normalise(py, raw, 8)?,
        };
        if self.parent_ids.len() >= STRINGS_MAX {
            self.parent_ids.clear();
        }
        self.parent_ids
            .insert(raw.to_owned(), made.as_ref().map(|s| s.clone_ref(py)));
        Ok(made)
    }

    fn name(&mut self, py: Python<'_>, raw: &str) -> Py<PyString> {
        if let Some(found) = self.names.get(raw) {
            return found.clone_ref(py);
        }
        let made = PyString::new(py, raw).unbind();
        if self.names.len() >= STRINGS_MAX {
            self.names.clear();
        }
        self.names.insert(raw.to_owned(), made.clone_ref(py));
        made
    }

    /// `helper.normalise_id(raw, size)`: base64 and the other spellings.
    fn normalise(
        &self,
        py: Python<'_>,
        raw: &str,
        size: usize,
    ) -> Result<Option<Py<PyString>>, Bail> {
        let value = self
            .helper
            .bind(py)
            .call_method1("normalise_id", (raw, size))?;
        if value.is_none() {
            return Ok(None);
        }
        Ok(Some(
            value.cast_into::<PyString>().map_err(|_| BAIL)?.unbind(),
        ))
    }

    /// The resource of these bytes, made by `helper.resource(raw)` once (up to RESOURCES_MAX).
    fn resource_key(&mut self, py: Python<'_>, raw: &[u8]) -> Result<Option<Resource>, Bail> {
        if self.resources.contains_key(raw) {
            return Ok(None); // the caller reads it from the map
        }
        let made = self
            .helper
            .bind(py)
            .call_method1("resource", (PyBytes::new(py, raw),))?
            .cast_into::<PyTuple>()
            .map_err(|_| BAIL)?;
        let empty = made.get_item(1)?.cast_into::<PyTuple>().map_err(|_| BAIL)?;
        if empty.len() != 7 {
            return Err(BAIL);
        }
        let resource = Resource {
            attributes: made
                .get_item(0)?
                .cast_into::<PyDict>()
                .map_err(|_| BAIL)?
                .unbind(),
            empty: empty.unbind(),
            has_job: made.get_item(2)?.is_truthy()?,
            tails: FastMap::default(),
            recent: Vec::new(),
        };
        if self.resources.len() < RESOURCES_MAX {
            self.resources.insert(raw.to_vec(), resource);
            return Ok(None);
        }
        Ok(Some(resource)) // not remembered: this line's own
    }

    /// The rows of a line: the scanner's groups where it takes the line, else the general
    /// parser's.
    fn rows<'py>(&mut self, py: Python<'py>, line: &[u8]) -> Result<Bound<'py, PyList>, Bail> {
        let mut parts = Vec::new();
        if let Some(groups) = scan::line(line, &mut self.recent) {
            self.scanned += 1;
            self.add_parts(py, groups, &mut parts)?;
        } else {
            self.parsed_parts(py, line, &mut parts)?;
        }
        make_rows(py, parts)
    }

    /// One span's row fields: ids, times and the row's tail (its last seven fields).
    fn span_parts(
        &mut self,
        py: Python<'_>,
        resource: &mut Resource,
        span: &SpanFields<'_>,
    ) -> Result<Parts, Bail> {
        let start = time_ns(span.start)?;
        let end = time_ns(span.end)?.max(start);
        let trace = self.trace_id(py, &span.trace_id)?;
        let span_id: Cow<'_, str> = match plain_id(&span.span_id, 8) {
            Some(text) => Cow::Owned(text),
            None => match self.normalise(py, &span.span_id, 8)? {
                Some(text) => Cow::Owned(text.bind(py).to_str()?.to_owned()),
                None => Cow::Borrowed(""),
            },
        };
        let parent = match span.parent_id.as_deref() {
            Some(raw) if !raw.is_empty() => self.parent_id(py, raw)?,
            _ => None,
        };
        let name = span.name.as_deref().map(|raw| self.name(py, raw));
        let tail = self.row_tail(py, resource, span.attributes)?;
        Ok(Parts {
            trace,
            span_id: span_id.into_owned(),
            parent,
            name,
            start,
            end,
            tail,
        })
    }

    /// The row's last seven fields (`rows.RowTail`) for an attribute list: one of the
    /// resource's last few lists, else its map, else parsed (and kept where shareable).
    fn row_tail(
        &mut self,
        py: Python<'_>,
        resource: &mut Resource,
        attributes: &[u8],
    ) -> Result<Py<PyTuple>, Bail> {
        if let Some(tail) = resource.recent_tail(py, attributes) {
            return Ok(tail);
        }
        if let Some(tail) = resource.tails.get(attributes) {
            let tail = tail.clone_ref(py);
            resource.remember(py, attributes, &tail);
            return Ok(tail);
        }
        let (tail, shared) = match self.keys.tail(py, resource, attributes)? {
            Some(tail) => (tail, true),
            None => {
                let made = self
                    .helper
                    .bind(py)
                    .call_method1(
                        "tail",
                        (resource.attributes.bind(py), PyBytes::new(py, attributes)),
                    )?
                    .cast_into::<PyTuple>()
                    .map_err(|_| BAIL)?;
                let tail = made.get_item(0)?.cast_into::<PyTuple>().map_err(|_| BAIL)?;
                (tail, made.get_item(1)?.is_truthy()?)
            }
        };
        if tail.len() != 7 {
            return Err(BAIL);
        }
        let tail = tail.unbind();
        if shared {
            if resource.tails.len() >= TAILS_MAX {
                resource.tails.clear(); // the older steps' lists
            }
            resource
                .tails
                .insert(attributes.to_vec(), tail.clone_ref(py));
            resource.remember(py, attributes, &tail);
        }
        Ok(tail)
    }

    /// The parts of a line the scanner left, read by the general parser (`Err`: the line is
    /// not read natively).
    fn parsed_parts(
        &mut self,
        py: Python<'_>,
        line: &[u8],
        into: &mut Vec<Parts>,
    ) -> Result<(), Bail> {
        let AsMap(data) = sonic_rs::from_slice::<AsMap<TracesData>>(line).map_err(|_| BAIL)?;
        let groups = sonic_groups(&data)?;
        self.add_parts(py, groups, into)
    }

    fn add_parts(
        &mut self,
        py: Python<'_>,
        groups: Vec<Group<'_>>,
        into: &mut Vec<Parts>,
    ) -> Result<(), Bail> {
        for group in &groups {
            // the group's resource out of the map while its spans are read: one lookup a group
            let (mut resource, kept) = match self.resource_key(py, group.resource)? {
                Some(own) => (own, false), // not remembered (RESOURCES_MAX)
                None => (self.resources.remove(group.resource).ok_or(BAIL)?, true),
            };
            let mut read = Ok(());
            for span in &group.spans {
                match self.span_parts(py, &mut resource, span) {
                    Ok(parts) => into.push(parts),
                    Err(bail) => {
                        read = Err(bail);
                        break;
                    }
                }
            }
            if kept {
                self.resources.insert(group.resource.to_vec(), resource);
            }
            read?;
        }
        Ok(())
    }
}

#[pymethods]
impl LineDecoder {
    /// `helper`: `resource(raw: bytes) -> (dict, the tail of no attributes, names the job)`,
    /// `tail(resource: dict, raw: bytes) -> (RowTail, shareable: bool)` and
    /// `normalise_id(raw: str, size: int) -> Optional[str]`; `slot_keys`: the five slot
    /// attributes in row order; `kept_keys`: the other attributes the analysis reads.
    #[new]
    fn new(helper: Py<PyAny>, slot_keys: Vec<String>, kept_keys: Vec<String>) -> PyResult<Self> {
        if slot_keys.len() != KEPT {
            return Err(PyException::new_err(format!(
                "{} slot keys, not {KEPT}",
                slot_keys.len()
            )));
        }
        let mut slots = FastMap::default();
        for key in kept_keys {
            slots.insert(key, KEPT);
        }
        for (index, key) in slot_keys.into_iter().enumerate() {
            slots.insert(key, index);
        }
        Ok(LineDecoder {
            helper,
            keys: Keys {
                slots,
                scanned: Cell::new(0),
            },
            resources: FastMap::default(),
            trace_ids: FastMap::default(),
            parent_ids: FastMap::default(),
            names: FastMap::default(),
            recent: scan::Recent::default(),
            bailed: 0,
            scanned: 0,
        })
    }

    /// Attribute lists read by the scanner (the plain layout); the others by the general
    /// parser (each distinct list once: the decoder caches its row fields).
    #[getter]
    fn lists_scanned(&self) -> u64 {
        self.keys.scanned.get()
    }

    /// Attribute lists the scanner took as one of the last few it met (by one comparison)
    #[getter]
    fn lists_recent(&self) -> u64 {
        self.recent.hits
    }

    /// The spill of the lines of `data[:stop]` as `tf_otel.analysis.load.spill._write` makes
    /// it: for each trace in order of first appearance (trace id, the length of its skeleton
    /// marshalled, the length of all its rows marshalled), those bytes one piece after another,
    /// the job ids the rows name, and the row count; None where a line (or a value) is not read
    /// natively: the caller decodes the block line by line.
    /// `skeleton`, `not_timeline`, `sync`: the category sets of `analysis.skeleton`.
    fn spill_block<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
        stop: usize,
        skeleton: Vec<String>,
        not_timeline: Vec<String>,
        sync: Vec<String>,
    ) -> PyResult<Option<Spilled<'py>>> {
        if stop > data.len() {
            return Err(PyException::new_err(format!(
                "bad block end {stop} of {} bytes",
                data.len()
            )));
        }
        let block = &data[..stop];
        let Ok(text) = simdutf8::basic::from_utf8(block) else {
            return Ok(None); // the Python path names the line
        };
        let mut rows: Vec<Parts> = Vec::new();
        let mut at = 0;
        while at < block.len() {
            // a line the scanner reads ends where its object (and spaces) end
            if let Some((groups, end)) = scan::object(text, at, &mut self.recent) {
                if end == block.len() || block[end] == b'\n' {
                    self.scanned += 1;
                    if let Err(bail) = self.add_parts(py, groups, &mut rows) {
                        return handed_back(py, bail);
                    }
                    at = end + 1;
                    continue;
                }
            }
            let end = block[at..]
                .iter()
                .position(|&byte| byte == b'\n')
                .map_or(block.len(), |length| at + length);
            let line = &block[at..end];
            at = end + 1;
            if line.contains(&b'\r') {
                return Ok(None); // lines as bytes.splitlines cuts them: the Python path
            }
            // blank: skipped, as the Python path skips it (bytes.strip's whitespace)
            if line.iter().all(|byte| b" \t\x0b\x0c".contains(byte)) {
                continue;
            }
            if let Err(bail) = self.parsed_parts(py, line, &mut rows) {
                return handed_back(py, bail);
            }
        }
        let sets = spill::Sets {
            skeleton,
            not_timeline,
            sync,
        };
        let made = match spill::pieces(py, &rows, &sets, block.len() / 2) {
            Ok(made) => made,
            Err(bail) => return handed_back(py, bail),
        };
        let count = rows.len();
        drop(rows); // before the bytes are copied
        let pieces = PyList::new(py, made.pieces)?;
        let bytes = PyBytes::new(py, &made.bytes);
        Ok(Some((pieces, bytes, PyList::new(py, made.jobs)?, count)))
    }

    /// The rows of the line `data[begin:end]`, or None: the generic path decides.
    /// An exception other than an `Exception` (KeyboardInterrupt) goes up.
    fn decode<'py>(
        &mut self,
        py: Python<'py>,
        data: &[u8],
        begin: usize,
        end: usize,
    ) -> PyResult<Option<Bound<'py, PyList>>> {
        if begin > end || end > data.len() {
            return Err(PyException::new_err(format!(
                "bad line bounds {begin}..{end} of {} bytes",
                data.len()
            )));
        }
        match self.rows(py, &data[begin..end]) {
            Ok(rows) => Ok(Some(rows)),
            Err(Bail(raised)) => {
                if let Some(err) = raised {
                    if !err.is_instance_of::<PyException>(py) {
                        return Err(err);
                    }
                }
                self.bailed += 1;
                Ok(None)
            }
        }
    }
}

/// A block's spill: the pieces (trace, head length, rows length), their bytes, the job ids, the
/// row count.
type Spilled<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyBytes>,
    Bound<'py, PyList>,
    usize,
);

/// A block handed back to the Python path (None), or the exception that must go up.
fn handed_back<'py>(py: Python<'py>, bail: Bail) -> PyResult<Option<Spilled<'py>>> {
    match bail {
        Bail(Some(err)) if !err.is_instance_of::<PyException>(py) => Err(err),
        _ => Ok(None),
    }
}

#[pymodule]
fn tf_otel_native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<LineDecoder>()?;
    module.add("FORMAT", 5)?;
    Ok(())
}
