//! The spill's pieces written natively: a block's rows grouped by trace, each group's skeleton
//! chosen, and both marshalled, without a Python object per row.
//!
//! Usage (inside the crate; `LineDecoder.spill_block` in lib.rs):
//!
//!     let made = spill::pieces(py, &rows, &sets, size)?;
//!     // made.pieces: (trace, head length, rows length) each; made.bytes: the pieces in turn
//!
//! `marshal.loads` of what it writes gives what `tf_otel.analysis.load.spill._write` gives
//! for the same rows: each piece's head as `analysis.skeleton.split_rows` makes it, then the
//! list of all its rows, in input order. Objects that the rows share (trace id, names, the
//! resource's attributes, each row tail's values, the shared empty dict, the kept attributes'
//! keys and values) are written once per blob (a piece's head, or its rows) and referred to
//! after, as `marshal.dumps` refers to repeated objects; each row's kept attributes are its own
//! dict.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

use crate::{Bail, FastMap, Parts, BAIL};

const FLAG_REF: u8 = 0x80;

/// The category sets the skeleton is chosen by (`analysis.skeleton`).
pub struct Sets {
    pub skeleton: Vec<String>,     // SKELETON_CATEGORIES
    pub not_timeline: Vec<String>, // _NOT_TIMELINE
    pub sync: Vec<String>,         // SYNC_CATEGORIES
}

/// A blob's reference tables, emptied and handed from one blob to the next so that a block's
/// pieces grow them once (a new map a blob rehashed as it grew: ~1 % of a span's decoding).
#[derive(Default)]
struct Tables {
    refs: FastMap<usize, u32>, // object address -> its reference number
    // a row tail's bytes once all its values are referred to (no definition among them): the
    // same for every later row with that tail
    tails: FastMap<usize, Vec<u8>>,
}

/// A marshal stream (format 4) of one blob.
struct Marshal {
    out: Vec<u8>,
    next: u32,
    tables: Tables,
}

impl Marshal {
    /// A blob written at the end of `out`, with `tables` emptied.
    fn over(out: Vec<u8>, mut tables: Tables) -> Self {
        tables.refs.clear();
        tables.tails.clear();
        Marshal {
            out,
            next: 0,
            tables,
        }
    }

    /// The bytes, and the tables for the next blob.
    fn done(self) -> (Vec<u8>, Tables) {
        (self.out, self.tables)
    }

    fn count(&mut self, code: u8, count: usize) {
        self.out.push(code);
        self.out.extend_from_slice(&(count as u32).to_le_bytes());
    }

    fn tuple_start(&mut self, length: usize) {
        if length < 256 {
            self.out.extend_from_slice(&[b')', length as u8]);
        } else {
            self.count(b'(', length);
        }
    }

    fn int(&mut self, value: i64, flag: u8) {
        if let Ok(small) = i32::try_from(value) {
            self.out.push(b'i' | flag);
            self.out.extend_from_slice(&small.to_le_bytes());
            return;
        }
        // 15-bit digits, least significant first; the count carries the sign (a nanosecond
        // time has 5: two a span, so they are built on the stack, not the heap)
        let mut magnitude = value.unsigned_abs();
        let mut digits = [0u8; 10]; // 64 bits: at most 5 digits of 15
        let mut count = 0;
        while magnitude != 0 {
            digits[2 * count..2 * count + 2]
                .copy_from_slice(&((magnitude & 0x7fff) as u16).to_le_bytes());
            magnitude >>= 15;
            count += 1;
        }
        let signed = if value < 0 {
            -(count as i32)
        } else {
            count as i32
        };
        self.out.push(b'l' | flag);
        self.out.extend_from_slice(&signed.to_le_bytes());
        self.out.extend_from_slice(&digits[..2 * count]);
    }

    fn text(&mut self, text: &str, flag: u8) {
        let bytes = text.as_bytes();
        if !text.is_ascii() {
            self.count(b'u' | flag, bytes.len());
        } else if bytes.len() < 256 {
            self.out
                .extend_from_slice(&[b'z' | flag, bytes.len() as u8]);
        } else {
            self.count(b'a' | flag, bytes.len());
        }
        self.out.extend_from_slice(bytes);
    }

    /// An object the rows share: written once with a reference mark, then referred to. The
    /// caller keeps it alive until the blob is done (its address is its key).
    fn shared(&mut self, value: &Bound<'_, PyAny>) -> Result<(), Bail> {
        if value.is_none() || value.is_instance_of::<PyBool>() {
            return self.value(value, 0); // singletons: never marked
        }
        let address = value.as_ptr() as usize;
        if let Some(&number) = self.tables.refs.get(&address) {
            self.out.push(b'r');
            self.out.extend_from_slice(&number.to_le_bytes());
            return Ok(());
        }
        self.tables.refs.insert(address, self.next);
        self.next += 1; // numbered in the order the reader meets them (containers first)
        self.value(value, FLAG_REF)
    }

    /// An object with the values it holds (none of them marked).
    fn value(&mut self, value: &Bound<'_, PyAny>, flag: u8) -> Result<(), Bail> {
        if value.is_none() {
            self.out.push(b'N');
        } else if let Ok(flag_value) = value.cast_exact::<PyBool>() {
            self.out
                .push(if flag_value.is_true() { b'T' } else { b'F' });
        } else if let Ok(int) = value.cast_exact::<PyInt>() {
            self.int(int.extract::<i64>().map_err(|_| BAIL)?, flag);
        } else if let Ok(text) = value.cast_exact::<PyString>() {
            self.text(text.to_str().map_err(|_| BAIL)?, flag);
        } else if let Ok(float) = value.cast_exact::<PyFloat>() {
            self.out.push(b'g' | flag);
            self.out.extend_from_slice(&float.value().to_le_bytes());
        } else if let Ok(dict) = value.cast_exact::<PyDict>() {
            self.out.push(b'{' | flag);
            for (key, item) in dict.iter() {
                self.value(&key, 0)?;
                self.value(&item, 0)?;
            }
            self.out.push(b'0');
        } else if let Ok(list) = value.cast_exact::<PyList>() {
            self.count(b'[' | flag, list.len());
            for item in list.iter() {
                self.value(&item, 0)?;
            }
        } else if let Ok(tuple) = value.cast_exact::<PyTuple>() {
            if flag != 0 {
                return Err(BAIL); // not among a row's values
            }
            self.tuple_start(tuple.len());
            for item in tuple.iter() {
                self.value(&item, 0)?;
            }
        } else {
            return Err(BAIL); // the Python path decides
        }
        Ok(())
    }

    fn optional(&mut self, value: &Option<Py<PyString>>, py: Python<'_>) -> Result<(), Bail> {
        match value {
            Some(text) => self.shared(text.bind(py).as_any()),
            None => {
                self.out.push(b'N');
                Ok(())
            }
        }
    }

    /// One row: the 13-tuple `model.Row`.
    fn row(&mut self, py: Python<'_>, parts: &Parts) -> Result<(), Bail> {
        let tail = parts.tail.bind(py);
        self.tuple_start(13);
        self.shared(parts.trace.bind(py).as_any())?;
        self.text(&parts.span_id, 0);
        self.optional(&parts.parent, py)?;
        self.optional(&parts.name, py)?;
        self.int(parts.start, 0);
        self.int(parts.end, 0);
        let key = tail.as_ptr() as usize;
        if let Some(bytes) = self.tables.tails.get(&key) {
            self.out.extend_from_slice(bytes);
            return Ok(());
        }
        let (start, defined) = (self.out.len(), self.next);
        let kept = tail.get_item(0)?;
        match kept.cast_exact::<PyDict>() {
            // each row its own dict; its keys and values are the tail's, shared as the rows
            // share them
            Ok(dict) if !dict.is_empty() => {
                self.out.push(b'{');
                for (key, item) in dict.iter() {
                    self.shared(&key)?;
                    self.shared(&item)?;
                }
                self.out.push(b'0');
            }
            _ => self.shared(&kept)?,
        }
        for at in 1..7 {
            self.shared(&tail.get_item(at)?)?;
        }
        if self.next == defined {
            self.tables.tails.insert(key, self.out[start..].to_vec());
        }
        Ok(())
    }
}

/// A block's pieces, one after another in `bytes`: (trace id, its head's length, its rows'
/// length) for each trace in order of first appearance; and the job ids the rows name.
pub struct Pieces {
    pub pieces: Vec<(Py<PyString>, usize, usize)>,
    pub bytes: Vec<u8>,
    pub jobs: Vec<Py<PyAny>>,
}

/// The rows of a block as the spill writes them (`spill._write`); `size`: about how many bytes
/// they take (one buffer for all, not one a piece).
pub fn pieces(py: Python<'_>, rows: &[Parts], sets: &Sets, size: usize) -> Result<Pieces, Bail> {
    let mut categories = Categories::new(sets);
    let mut groups: Vec<(Py<PyString>, Vec<usize>)> = Vec::new();
    let mut by_trace: FastMap<String, usize> = FastMap::default();
    let mut jobs: FastMap<usize, Py<PyAny>> = FastMap::default();
    let mut facts: Vec<Facts> = Vec::with_capacity(rows.len());
    for (at, parts) in rows.iter().enumerate() {
        let trace = parts.trace.bind(py).to_str()?;
        let group = match by_trace.get(trace) {
            Some(&group) => group,
            None => {
                by_trace.insert(trace.to_owned(), groups.len());
                groups.push((parts.trace.clone_ref(py), Vec::new()));
                groups.len() - 1
            }
        };
        groups[group].1.push(at);
        let tail = parts.tail.bind(py);
        let job = tail.get_item(5)?;
        if !job.is_none() {
            jobs.entry(job.as_ptr() as usize)
                .or_insert_with(|| job.unbind());
        }
        facts.push(categories.facts(tail)?);
    }
    let mut pieces = Vec::with_capacity(groups.len());
    let mut bytes = Vec::with_capacity(size);
    let mut tables = Tables::default();
    for (trace, members) in groups {
        let start = bytes.len();
        let mut skeleton = Marshal::over(bytes, tables);
        head(py, rows, &facts, &members, &categories, &mut skeleton)?;
        let middle = skeleton.out.len();
        let (out, used) = skeleton.done();
        let mut every = Marshal::over(out, used);
        every.count(b'[', members.len());
        for &at in &members {
            every.row(py, &rows[at])?;
        }
        (bytes, tables) = every.done();
        pieces.push((trace, middle - start, bytes.len() - middle));
    }
    Ok(Pieces {
        pieces,
        bytes,
        jobs: jobs.into_values().collect(),
    })
}

/// A group's skeleton as `analysis.skeleton.split_rows` chooses it, marshalled into `out`:
/// (its rows, their positions among the group's or None where it is all of them, the ranks and
/// the categories of the group's rows).
fn head(
    py: Python<'_>,
    rows: &[Parts],
    facts: &[Facts],
    members: &[usize],
    categories: &Categories,
    out: &mut Marshal,
) -> Result<(), Bail> {
    let mut keep: Vec<bool> = members
        .iter()
        .map(|&at| {
            let fact = &facts[at];
            categories.kind[fact.category].skeleton || fact.rank.is_none() || fact.gpu
        })
        .collect();
    // each rank's first row that is not a root, job or stall (else its last one)
    let mut first: FastMap<i64, Option<usize>> = FastMap::default(); // None: found
    let mut sync: Option<usize> = None;
    for (position, &at) in members.iter().enumerate() {
        let fact = &facts[at];
        let kind = &categories.kind[fact.category];
        if sync.is_none() && kind.sync {
            sync = Some(position);
        }
        let Some(rank) = fact.rank else { continue };
        let state = first.entry(rank).or_insert(Some(position));
        if let Some(last) = state {
            *last = position;
            if !kind.not_timeline {
                keep[position] = true;
                *state = None;
            }
        }
    }
    for last in first.values().flatten() {
        keep[*last] = true;
    }
    if let Some(position) = sync {
        keep[position] = true;
    }
    out.tuple_start(4);
    if keep.iter().all(|&kept| kept) {
        out.count(b'[', members.len());
        for &at in members {
            out.row(py, &rows[at])?;
        }
        out.out.extend_from_slice(&[b'N', b')', 0, b')', 0]);
        return Ok(());
    }
    let positions: Vec<usize> = (0..members.len()).filter(|&p| keep[p]).collect();
    out.count(b'[', positions.len());
    for &position in &positions {
        out.row(py, &rows[members[position]])?;
    }
    out.count(b'[', positions.len());
    for &position in &positions {
        out.int(position as i64, 0);
    }
    let mut ranks: Vec<i64> = first.into_keys().collect();
    ranks.sort_unstable();
    out.tuple_start(ranks.len());
    for rank in ranks {
        out.int(rank, 0);
    }
    let mut names: Vec<&str> = members
        .iter()
        .map(|&at| categories.names[facts[at].category].as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    out.tuple_start(names.len());
    for name in names {
        out.text(name, 0);
    }
    Ok(())
}

/// What the skeleton is chosen by, of one row.
struct Facts {
    category: usize, // in `Categories`
    rank: Option<i64>,
    gpu: bool, // a GPU value (not None)
}

#[derive(Clone, Copy)]
struct Kind {
    skeleton: bool,
    not_timeline: bool,
    sync: bool,
}

/// The categories met in a block, numbered (rows share the category objects of their tails,
/// which live as long as the rows: an object's address finds its number).
struct Categories<'s> {
    sets: &'s Sets,
    names: Vec<String>,
    kind: Vec<Kind>,
    by_address: FastMap<usize, usize>,
}

impl<'s> Categories<'s> {
    fn new(sets: &'s Sets) -> Self {
        Categories {
            sets,
            names: Vec::new(),
            kind: Vec::new(),
            by_address: FastMap::default(),
        }
    }

    fn facts(&mut self, tail: &Bound<'_, PyTuple>) -> Result<Facts, Bail> {
        let category = tail.get_item(2)?;
        let address = category.as_ptr() as usize;
        let number = match self.by_address.get(&address) {
            Some(&number) => number,
            None => {
                // a category that is not text: the Python path decides
                let text = category
                    .cast_exact::<PyString>()
                    .map_err(|_| BAIL)?
                    .to_str()?;
                let number = match self.names.iter().position(|name| name == text) {
                    Some(number) => number,
                    None => {
                        let has = |set: &[String]| set.iter().any(|name| name == text);
                        self.kind.push(Kind {
                            skeleton: has(&self.sets.skeleton),
                            not_timeline: has(&self.sets.not_timeline),
                            sync: has(&self.sets.sync),
                        });
                        self.names.push(text.to_owned());
                        self.names.len() - 1
                    }
                };
                self.by_address.insert(address, number);
                number
            }
        };
        let rank = tail.get_item(3)?;
        let rank = if rank.is_none() {
            None
        } else {
            let int = rank.cast_exact::<PyInt>().map_err(|_| BAIL)?;
            Some(int.extract::<i64>().map_err(|_| BAIL)?)
        };
        Ok(Facts {
            category: number,
            rank,
            gpu: !tail.get_item(6)?.is_none(),
        })
    }
}
