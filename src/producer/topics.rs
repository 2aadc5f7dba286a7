//! The output topics checked at start, before the consumer joins: each one
//! the configuration names exists (a broker that creates topics on demand
//! creates it for the producer's metadata request) and this client may
//! write it. A start that fails here names the topic and the key that set
//! it; without the check a missing samples topic used to hold every
//! partition within seconds.
//!
//! Writable is read from the topic's authorized operations (Kafka's
//! DescribeTopics, through librdkafka's admin API, which rust-rdkafka does
//! not wrap): a broker with an authorizer lists them; one without lists
//! none, and then every client may write.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// How long the authorized operations are waited for: Kafka answers in
/// tens of milliseconds; a cluster that does not answer DescribeTopics
/// costs each start this much, and the writes are then not checked before
/// the first record.
const DESCRIBE_WAIT: Duration = Duration::from_secs(2);

/// An output topic that cannot take this service's records.
#[derive(Debug, thiserror::Error)]
#[error("{key} = {topic:?}: {problem}")]
pub struct TopicCheckError {
    pub key: String,
    pub topic: String,
    pub problem: String,
}

/// Checks each `(key, topic)` (see the module's docs), blocking up to
/// about `timeout` per request.
pub fn check<C: rdkafka::client::ClientContext>(
    client: &Client<C>,
    topics: &[(String, String)],
    timeout: Duration,
) -> Result<(), TopicCheckError> {
    for (key, topic) in topics {
        let refused = |problem: String| TopicCheckError {
            key: key.clone(),
            topic: topic.clone(),
            problem,
        };
        exists(client, topic, timeout).map_err(refused)?;
    }
    let names: Vec<&str> = topics.iter().map(|(_, t)| t.as_str()).collect();
    // Any broker answers it (it is a metadata request); librdkafka sends it
    // to the controller by default, which librdkafka's mock cluster (the
    // demo's) never names.
    let broker = client
        .fetch_metadata(None, timeout)
        .ok()
        .and_then(|m| m.brokers().first().map(|b| b.id()));
    let described = match describe(client, &names, broker, timeout.min(DESCRIBE_WAIT)) {
        Ok(described) => described,
        Err(e) => {
            // A cluster without DescribeTopics: existence was checked.
            tracing::info!(error = %e, "the cluster does not describe the output topics; writes are not checked before the first record");
            return Ok(());
        }
    };
    for (key, topic) in topics {
        let refused = |problem: String| TopicCheckError {
            key: key.clone(),
            topic: topic.clone(),
            problem,
        };
        match described.iter().find(|d| d.name == *topic) {
            Some(Described { error: Some(e), .. }) => return Err(refused(e.clone())),
            Some(Described {
                writable: false, ..
            }) => {
                return Err(refused(
                    "this client is not authorized to write it (its ACLs allow no Write)".into(),
                ));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The topic exists, or the broker created it for this request.
fn exists<C: rdkafka::client::ClientContext>(
    client: &Client<C>,
    topic: &str,
    timeout: Duration,
) -> Result<(), String> {
    // A broker that creates topics on demand may answer the first request
    // before the new topic has a leader.
    let mut last = String::new();
    for attempt in 0..3 {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(500));
        }
        let metadata = client
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| format!("the cluster does not answer: {e}"))?;
        let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
            last = "does not exist".into();
            continue;
        };
        match t.error().map(RDKafkaErrorCode::from) {
            None if !t.partitions().is_empty() => return Ok(()),
            None | Some(RDKafkaErrorCode::LeaderNotAvailable) => last = "has no leader yet".into(),
            Some(RDKafkaErrorCode::UnknownTopicOrPartition) => {
                last = "does not exist (create it, or let the broker create topics)".into()
            }
            Some(RDKafkaErrorCode::TopicAuthorizationFailed) => {
                return Err("this client is not authorized to see it".into());
            }
            Some(other) => last = format!("{other}"),
        }
    }
    Err(last)
}

/// A topic as DescribeTopics answers for it.
struct Described {
    name: String,
    error: Option<String>,
    /// Write (or All) among its authorized operations, or none listed.
    writable: bool,
}

/// DescribeTopics with authorized operations, on the client's handle.
fn describe<C: rdkafka::client::ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    broker: Option<i32>,
    timeout: Duration,
) -> Result<Vec<Described>, KafkaError> {
    let names: Vec<CString> = topics
        .iter()
        .filter_map(|t| CString::new(*t).ok())
        .collect();
    let mut pointers: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let rk = client.native_ptr();
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: every handle made here is destroyed on every path below; the
    // names outlive the collection; the client outlives the call.
    unsafe {
        let collection =
            rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len());
        let options = rd::rd_kafka_AdminOptions_new(
            rk,
            rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        );
        let error = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options, 1);
        if !error.is_null() {
            rd::rd_kafka_error_destroy(error);
        }
        let mut errstr = [0 as std::ffi::c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options,
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if let Some(id) = broker {
            rd::rd_kafka_AdminOptions_set_broker(options, id, errstr.as_mut_ptr(), errstr.len());
        }
        let queue = rd::rd_kafka_queue_new(rk);
        rd::rd_kafka_DescribeTopics(rk, collection, options, queue);
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms.saturating_add(1000));
        let result = read_event(event);
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_queue_destroy(queue);
        rd::rd_kafka_AdminOptions_destroy(options);
        rd::rd_kafka_TopicCollection_destroy(collection);
        result
    }
}

/// The topics of a DescribeTopics result event.
///
/// # Safety
/// `event` is null or a live event of this request.
unsafe fn read_event(event: *mut rd::rd_kafka_event_t) -> Result<Vec<Described>, KafkaError> {
    let failed = |code| KafkaError::AdminOp(RDKafkaErrorCode::from(code));
    if event.is_null() {
        return Err(failed(
            rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__TIMED_OUT,
        ));
    }
    // SAFETY: a live event (the caller's promise), read and not kept.
    unsafe {
        let code = rd::rd_kafka_event_error(event);
        if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(failed(code));
        }
        let result = rd::rd_kafka_event_DescribeTopics_result(event);
        if result.is_null() {
            return Err(failed(rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR__FAIL));
        }
        let mut count = 0usize;
        let descriptions = rd::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let d = *descriptions.add(i);
            let name = CStr::from_ptr(rd::rd_kafka_TopicDescription_name(d))
                .to_string_lossy()
                .into_owned();
            let error = rd::rd_kafka_TopicDescription_error(d);
            let error = (!error.is_null()
                && rd::rd_kafka_error_code(error)
                    != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
                .then(|| {
                    CStr::from_ptr(rd::rd_kafka_error_string(error))
                        .to_string_lossy()
                        .into_owned()
                });
            let mut ops = 0usize;
            let listed = rd::rd_kafka_TopicDescription_authorized_operations(d, &mut ops);
            let writable = listed.is_null()
                || ops == 0
                || (0..ops).any(|k| {
                    matches!(
                        *listed.add(k),
                        rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_WRITE
                            | rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_ALL
                    )
                });
            out.push(Described {
                name,
                error,
                writable,
            });
        }
        Ok(out)
    }
}
