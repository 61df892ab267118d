//! `SOFTROCE_DEVICE` chooses the default device. In a test binary of its
//! own: setting an environment variable while other threads may read the
//! environment is a race, and every other test binary runs tests in
//! parallel.

use softroce::verbs::{Device, Error};

#[test]
fn default_device_honours_softroce_device() {
    let first = Device::list().unwrap().remove(0);

    std::env::set_var("SOFTROCE_DEVICE", "sr_lo");
    let chosen = Device::default_device().map(|d| d.name().to_owned());
    std::env::set_var("SOFTROCE_DEVICE", "sr_no_such_interface");
    let missing = Device::default_device();
    std::env::set_var("SOFTROCE_DEVICE", "");
    let empty = Device::default_device().map(|d| d.name().to_owned());
    std::env::remove_var("SOFTROCE_DEVICE");
    let unset = Device::default_device().map(|d| d.name().to_owned());

    assert_eq!(chosen.unwrap(), "sr_lo");
    assert!(matches!(missing, Err(Error::NoSuchDevice { .. })), "{missing:?}");
    assert_eq!(empty.unwrap(), first.name());
    assert_eq!(unset.unwrap(), first.name());
}
