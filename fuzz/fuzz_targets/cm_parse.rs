//! Whatever bytes arrive on QP 1, the MAD and CM parsers must not panic, and
//! whatever they accept must survive a trip through its bytes: re-emitting
//! and re-parsing gives the same value, and re-emitting that changes nothing.

#![no_main]

use libfuzzer_sys::fuzz_target;
use softroce::wire::cm::CmMessage;
use softroce::wire::cma::{CmaHeader, CmaHeaderRepr};
use softroce::wire::mad::{Mad, MadRepr, DATA_LEN, MAD_LEN};
use softroce::wire::CmMad;

fuzz_target!(|data: &[u8]| {
    // The input as a whole MAD.
    if let Ok(mad) = CmMad::parse(data) {
        let mut bytes = [0u8; MAD_LEN];
        mad.emit(&mut bytes).expect("a parsed MAD re-emits");
        assert_eq!(CmMad::parse(&bytes), Ok(mad));
        let mut again = [0u8; MAD_LEN];
        mad.emit(&mut again).unwrap();
        assert_eq!(again, bytes);
    }
    if let Ok(header) = Mad::new_checked(data).and_then(|m| MadRepr::parse(&m)) {
        let mut bytes = [0u8; MAD_LEN];
        header.emit(&mut Mad::new_unchecked(&mut bytes[..])).unwrap();
        assert_eq!(MadRepr::parse(&Mad::new_unchecked(&bytes[..])), Ok(header));
    }
    // The first two bytes as an attribute ID, the rest as a message's data,
    // so every message type is reached without a valid header.
    if let [high, low, rest @ ..] = data {
        let attribute = u16::from_be_bytes([*high, *low]);
        if let Ok(message) = CmMessage::parse(attribute, rest) {
            let mut bytes = [0u8; DATA_LEN];
            message.emit(&mut bytes).expect("a parsed message re-emits");
            assert_eq!(CmMessage::parse(attribute, &bytes), Ok(message));
        }
    }
    if let Ok(header) = CmaHeaderRepr::parse(&CmaHeader::new_unchecked(data)) {
        let mut bytes = [0u8; 36];
        header.emit(&mut CmaHeader::new_unchecked(&mut bytes[..])).expect("a parsed CMA header re-emits");
        assert_eq!(CmaHeaderRepr::parse(&CmaHeader::new_unchecked(&bytes[..])), Ok(header));
    }
});
