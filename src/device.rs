//! What a worker runs on and at which precision: [`Device`] (cpu or cuda:N) and [`Precision`].
//! A leaf: the model, the GPU readings (`gpu`), the libtorch shim and the configuration all name
//! these, and this module names none of them.

use std::fmt;
use std::str::FromStr;

/// Where inference runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    Cuda(usize),
}

/// A value that is not a device or a precision.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not a {what}: use {expected}")]
pub struct ParseError {
    pub value: String,
    pub what: &'static str,
    pub expected: &'static str,
}

impl FromStr for Device {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.trim() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => Ok(Device::Cuda(0)),
            other => other
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Device::Cuda)
                .ok_or_else(|| ParseError { value: other.to_string(), what: "device", expected: "cpu or cuda:N" }),
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

impl Device {
    pub fn to_tch(self) -> tch::Device {
        match self {
            Device::Cpu => tch::Device::Cpu,
            Device::Cuda(n) => tch::Device::Cuda(n),
        }
    }
}

/// Numeric precision of inference. Weights stay fp32; fp16/bf16 run under autocast with that
/// dtype; tf32 lets fp32 matmuls and convolutions use TF32 tensor cores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    Fp32,
    Tf32,
    Fp16,
    Bf16,
}

impl FromStr for Precision {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "fp32" | "float32" => Ok(Precision::Fp32),
            "tf32" => Ok(Precision::Tf32),
            "fp16" | "float16" | "half" => Ok(Precision::Fp16),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(ParseError { value: other.to_string(), what: "precision", expected: "fp32, tf32, fp16 or bf16" }),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Precision {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Precision, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
        })
    }
}

