//! Functions whose value is not a function of their arguments: the clock
//! (`NOW()`, `CURRENT_TIMESTAMP`, `LOCALTIMESTAMP`, `CURRENT_DATE`,
//! `CURRENT_TIME`, `LOCALTIME`, `CURRENT_ROW_TIMESTAMP()`) and `RAND`,
//! `RAND_INTEGER`.
//!
//! A streaming Flink job evaluates the clock functions per record, not
//! once per query (DataFusion's `now()` is folded into a constant when the
//! plan is made); here they are volatile and read the clock once per batch
//! of rows, which are processed at the same instant. The local values
//! are UTC's here; in a session with another `table.local-time-zone`,
//! `flink_zone` converts them to the zone's.
//!
//! `RAND(seed)` and `RAND_INTEGER(seed, bound)` give the numbers of
//! `java.util.Random` as Flink's generated code does: with a literal seed,
//! one generator per call site, advanced row by row (so a query's values
//! are Flink's, at parallelism 1; at a higher one, the subtasks share the
//! call site's generator); with a seed read from the row, the first number
//! of a generator made from that seed; without a seed, a generator seeded
//! from the clock.

use std::sync::{Arc, Mutex};

use arrow::array::{Array, ArrayRef, AsArray, Float64Builder, Int32Builder};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Int64Type, TimeUnit};
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility};

/// The clock functions, to register (over DataFusion's `now`).
pub fn clocks() -> Vec<ScalarUDF> {
    [
        ("now", Clock::Instant),
        ("current_timestamp", Clock::Instant),
        ("current_row_timestamp", Clock::Instant),
        ("localtimestamp", Clock::Local),
        ("current_date", Clock::Date),
        ("current_time", Clock::Time),
        ("localtime", Clock::Time),
    ]
    .into_iter()
    .map(|(name, clock)| {
        ScalarUDF::new_from_impl(ClockFn {
            name,
            clock,
            signature: Signature::nullary(Volatility::Volatile),
        })
    })
    .collect()
}

/// `LOCALTIMESTAMP` in UTC (the session zone's is this converted:
/// `flink_zone`).
pub fn local_timestamp() -> ScalarUDF {
    ScalarUDF::new_from_impl(ClockFn {
        name: "localtimestamp",
        clock: Clock::Local,
        signature: Signature::nullary(Volatility::Volatile),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Clock {
    /// TIMESTAMP_LTZ(3).
    Instant,
    /// TIMESTAMP(3), the session zone's wall time.
    Local,
    /// DATE.
    Date,
    /// TIME(0).
    Time,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ClockFn {
    name: &'static str,
    clock: Clock,
    signature: Signature,
}

impl ScalarUDFImpl for ClockFn {
    fn name(&self) -> &str {
        self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _arg_types: &[DataType]) -> Result<DataType> {
        Ok(match self.clock {
            Clock::Instant => DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
            Clock::Local => DataType::Timestamp(TimeUnit::Millisecond, None),
            Clock::Date => DataType::Date32,
            Clock::Time => DataType::Time32(TimeUnit::Second),
        })
    }

    /// NOT NULL, as Flink types them.
    fn return_field_from_args(
        &self,
        _args: datafusion::logical_expr::ReturnFieldArgs,
    ) -> Result<arrow::datatypes::FieldRef> {
        Ok(Arc::new(arrow::datatypes::Field::new(
            self.name,
            self.return_type(&[])?,
            false,
        )))
    }

    fn invoke_with_args(&self, _args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        const DAY_MS: i64 = 86_400_000;
        Ok(ColumnarValue::Scalar(match self.clock {
            Clock::Instant => ScalarValue::TimestampMillisecond(Some(ms), Some("UTC".into())),
            Clock::Local => ScalarValue::TimestampMillisecond(Some(ms), None),
            Clock::Date => ScalarValue::Date32(Some(ms.div_euclid(DAY_MS) as i32)),
            Clock::Time => ScalarValue::Time32Second(Some((ms.rem_euclid(DAY_MS) / 1000) as i32)),
        }))
    }
}

/// `java.util.Random`: its 48-bit linear congruential generator and the
/// derivations Flink calls (`nextDouble`, `nextInt(bound)`).
#[derive(Debug)]
pub struct JavaRandom {
    seed: i64,
}

const MULTIPLIER: i64 = 0x5_DEEC_E66D;
const MASK: i64 = (1 << 48) - 1;

impl JavaRandom {
    pub fn new(seed: i64) -> Self {
        Self {
            seed: (seed ^ MULTIPLIER) & MASK,
        }
    }

    fn from_clock() -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        Self::new(nanos ^ 0x2545_F491_4F6C_DD1D)
    }

    fn next(&mut self, bits: u32) -> i32 {
        self.seed = self.seed.wrapping_mul(MULTIPLIER).wrapping_add(0xB) & MASK;
        (self.seed >> (48 - bits)) as i32
    }

    pub fn next_double(&mut self) -> f64 {
        let high = i64::from(self.next(26)) << 27;
        let low = i64::from(self.next(27));
        (high + low) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// `bound` > 0.
    pub fn next_int(&mut self, bound: i32) -> i32 {
        let mut r = self.next(31);
        let m = bound.wrapping_sub(1);
        if bound & m == 0 {
            return ((i64::from(bound) * i64::from(r)) >> 31) as i32;
        }
        let mut u = r;
        loop {
            r = u % bound;
            if u.wrapping_sub(r).wrapping_add(m) >= 0 {
                return r;
            }
            u = self.next(31);
        }
    }
}

/// `RAND` and `RAND_INTEGER`: `generator` is the call site's, used when
/// it has no seed or a literal one (`literal_seed`); a seed read from the
/// row makes a generator per row.
pub struct Rand {
    integer: bool,
    signature: Signature,
    generator: Arc<Mutex<JavaRandom>>,
    /// The call's literal seed (`None`: seeded from the clock).
    seed: Option<i64>,
    literal_seed: bool,
}

/// `RAND()` takes no argument or a seed (a variadic signature alone
/// refuses a call without arguments); `RAND_INTEGER` one or two.
fn rand_signature(integer: bool) -> Signature {
    use datafusion::logical_expr::TypeSignature;
    if integer {
        Signature::variadic_any(Volatility::Volatile)
    } else {
        Signature::one_of(
            vec![TypeSignature::Nullary, TypeSignature::VariadicAny],
            Volatility::Volatile,
        )
    }
}

/// What the call means, not the generator's moving state: operator uids
/// describe functions by their debug text (a clock seed would give the
/// query another uid in every run).
impl std::fmt::Debug for Rand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rand")
            .field("integer", &self.integer)
            .field("seed", &self.seed)
            .field("literal_seed", &self.literal_seed)
            .finish()
    }
}

impl PartialEq for Rand {
    fn eq(&self, other: &Self) -> bool {
        self.integer == other.integer && Arc::ptr_eq(&self.generator, &other.generator)
    }
}

impl Eq for Rand {}

impl std::hash::Hash for Rand {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.integer.hash(state);
        (Arc::as_ptr(&self.generator) as usize).hash(state);
    }
}

impl Rand {
    /// The registered `rand` and `rand_integer`: the planner gives each
    /// call with a literal seed or none its own ([`Rand::for_call`]).
    pub fn udfs() -> Vec<ScalarUDF> {
        [false, true]
            .into_iter()
            .map(|integer| {
                ScalarUDF::new_from_impl(Rand {
                    integer,
                    signature: rand_signature(integer),
                    generator: Arc::new(Mutex::new(JavaRandom::from_clock())),
                    seed: None,
                    literal_seed: false,
                })
            })
            .collect()
    }

    /// The function for one call with `args`: its own generator when the
    /// seed is a literal (`NULL`: none, every value is NULL) or absent.
    pub fn for_call(name: &str, args: &[datafusion::logical_expr::Expr]) -> Option<ScalarUDF> {
        use datafusion::logical_expr::Expr;
        let integer = match name {
            "rand" => false,
            "rand_integer" => true,
            _ => return None,
        };
        let seeded = args.len() == if integer { 2 } else { 1 };
        let (generator, seed) = if !seeded {
            (JavaRandom::from_clock(), None)
        } else {
            match &args[0] {
                Expr::Literal(v, _) if v.data_type().is_integer() => {
                    let seed = v.cast_to(&DataType::Int64).ok()?;
                    match seed {
                        ScalarValue::Int64(Some(s)) => (JavaRandom::new(s), Some(s)),
                        _ => return None,
                    }
                }
                _ => return None,
            }
        };
        Some(ScalarUDF::new_from_impl(Rand {
            integer,
            signature: rand_signature(integer),
            generator: Arc::new(Mutex::new(generator)),
            seed,
            literal_seed: seeded,
        }))
    }

    fn name_upper(&self) -> &'static str {
        if self.integer { "RAND_INTEGER" } else { "RAND" }
    }
}

fn int64s(a: &ArrayRef, what: &str, name: &str) -> Result<ArrayRef> {
    if !a.data_type().is_integer() && a.data_type() != &DataType::Null {
        return exec_err!(
            "{name}'s {what} must be an integer, not {}",
            crate::types::flink_name(a.data_type())
        );
    }
    Ok(cast(a, &DataType::Int64)?)
}

impl ScalarUDFImpl for Rand {
    fn name(&self) -> &str {
        if self.integer { "rand_integer" } else { "rand" }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> Result<DataType> {
        let (most, out) = if self.integer {
            (2, DataType::Int32)
        } else {
            (1, DataType::Float64)
        };
        let least = usize::from(self.integer);
        if arg_types.len() < least || arg_types.len() > most {
            return plan_err!(
                "{} takes {} arguments, not {}",
                self.name_upper(),
                if self.integer { "1 or 2" } else { "0 or 1" },
                arg_types.len()
            );
        }
        if let Some(t) = arg_types.iter().find(|t| !t.is_integer() && **t != DataType::Null) {
            return plan_err!(
                "{} takes integers, not {}",
                self.name_upper(),
                crate::types::flink_name(t)
            );
        }
        Ok(out)
    }

    /// NOT NULL unless an argument may be NULL (Flink types `RAND()` and
    /// `RAND_INTEGER(10)` `NOT NULL`).
    fn return_field_from_args(
        &self,
        args: datafusion::logical_expr::ReturnFieldArgs,
    ) -> Result<arrow::datatypes::FieldRef> {
        let types: Vec<DataType> = args.arg_fields.iter().map(|f| f.data_type().clone()).collect();
        let nullable = args.arg_fields.iter().any(|f| f.is_nullable());
        Ok(Arc::new(arrow::datatypes::Field::new(
            self.name(),
            self.return_type(&types)?,
            nullable,
        )))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let name = self.name_upper();
        let cols = args.args.iter().map(|a| a.to_array(n)).collect::<Result<Vec<_>>>()?;
        let seeded = cols.len() == if self.integer { 2 } else { 1 };
        let seeds = if seeded {
            Some(int64s(&cols[0], "seed", name)?)
        } else {
            None
        };
        let bounds = if self.integer {
            Some(int64s(&cols[cols.len() - 1], "bound", name)?)
        } else {
            None
        };
        let mut own =
            if !seeded || self.literal_seed {
                Some(self.generator.lock().map_err(|_| {
                    datafusion::error::DataFusionError::Execution(format!("{name}: generator poisoned"))
                })?)
            } else {
                None
            };
        let one_of_seed = |i: usize| -> Option<JavaRandom> {
            let s = seeds.as_ref()?.as_primitive::<Int64Type>();
            s.is_valid(i).then(|| JavaRandom::new(s.value(i)))
        };
        let seed_is_null = |i: usize| seeds.as_ref().is_some_and(|s| s.is_null(i));
        if let Some(bounds) = &bounds {
            let bounds = bounds.as_primitive::<Int64Type>();
            let mut out = Int32Builder::with_capacity(n);
            for i in 0..n {
                if bounds.is_null(i) || seed_is_null(i) {
                    out.append_null();
                    continue;
                }
                let bound = bounds.value(i);
                let Some(bound) = i32::try_from(bound).ok().filter(|b| *b > 0) else {
                    return exec_err!("{name}: the bound must be positive, not {bound}");
                };
                let v = match own.as_deref_mut() {
                    Some(g) => g.next_int(bound),
                    None => match one_of_seed(i) {
                        Some(mut g) => g.next_int(bound),
                        None => {
                            out.append_null();
                            continue;
                        }
                    },
                };
                out.append_value(v);
            }
            return Ok(ColumnarValue::Array(Arc::new(out.finish())));
        }
        let mut out = Float64Builder::with_capacity(n);
        for i in 0..n {
            if seed_is_null(i) {
                out.append_null();
                continue;
            }
            match own.as_deref_mut() {
                Some(g) => out.append_value(g.next_double()),
                None => match one_of_seed(i) {
                    Some(mut g) => out.append_value(g.next_double()),
                    None => out.append_null(),
                },
            }
        }
        Ok(ColumnarValue::Array(Arc::new(out.finish())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `new java.util.Random(seed)` in Java 17, as Flink 2.3 answered
    /// `RAND(42)`, `RAND_INTEGER(42, 10)`, `RAND_INTEGER(7, 1000000)` and
    /// `RAND(i)` row by row.
    #[test]
    fn java_random_gives_javas_numbers() {
        let mut r = JavaRandom::new(42);
        let doubles: Vec<f64> = (0..5).map(|_| r.next_double()).collect();
        assert_eq!(
            doubles,
            [
                0.7275636800328681,
                0.6832234717598454,
                0.30871945533265976,
                0.27707849007413665,
                0.6655489517945736
            ]
        );
        let mut r = JavaRandom::new(42);
        assert_eq!((0..5).map(|_| r.next_int(10)).collect::<Vec<_>>(), [0, 3, 8, 4, 0]);
        let mut r = JavaRandom::new(7);
        assert_eq!(
            (0..5).map(|_| r.next_int(1_000_000)).collect::<Vec<_>>(),
            [164236, 249164, 829485, 678044, 989380]
        );
        assert_eq!(JavaRandom::new(7).next_double(), 0.7306990420600421);
        assert_eq!(JavaRandom::new(-7).next_double(), 0.2691218093260761);
        assert_eq!(JavaRandom::new(0).next_double(), 0.730967787376657);
        assert_eq!(JavaRandom::new(2147483647).next_double(), 0.6201007799387834);
        // A power of two takes the high bits.
        let mut r = JavaRandom::new(42);
        assert!((0..100).all(|_| (0..16).contains(&r.next_int(16))));
    }
}
