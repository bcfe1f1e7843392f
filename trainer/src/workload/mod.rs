//! What is trained on what: the traits the loop speaks to ([`task`]), the two recipes
//! ([`model`]), the two kinds of data ([`data`]), the character corpus ([`text`]), text sampled
//! from a trained GPT ([`sample`]), the host-memory check before data or a model is made
//! ([`host`]), tokenizers ([`tokenizer`]), token files on disk ([`token_files`]),
//! `plimsoll prepare`, which makes them ([`prepare`]), and ResNets on synthetic images
//! ([`images`]).

pub mod data;
pub mod host;
pub mod images;
pub mod model;
pub mod prepare;
pub mod sample;
pub mod task;
pub mod text;
pub mod token_files;
pub mod tokenizer;
