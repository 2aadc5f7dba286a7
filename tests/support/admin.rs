//! Topics on the tests' Apache Kafka, through the admin API: created,
//! grown, deleted; and a plain member joining a group and leaving it.

use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};

use super::Broker;

impl Broker {
    /// An admin client of the cluster and a runtime to wait on it with.
    fn admin(&self) -> (AdminClient<DefaultClientContext>, tokio::runtime::Runtime) {
        let admin = ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        (admin, rt)
    }

    /// Waits (at most 30 s) until partitions 0 to `partitions` of `name`
    /// have a leader.
    fn wait_for_leaders(&self, name: &str, partitions: i32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while (0..partitions).any(|p| self.leader(name, p) < 0) {
            assert!(Instant::now() < deadline, "topic {name} has no leaders");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Creates a topic with the cluster's replication factor and waits until
    /// every partition has a leader.
    pub fn create_topic(&self, name: &str, partitions: i32) {
        let (admin, rt) = self.admin();
        let replication = self.node_ids().len().min(3) as i32;
        let results = rt
            .block_on(admin.create_topics(
                &[NewTopic::new(
                    name,
                    partitions,
                    TopicReplication::Fixed(replication),
                )],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
            ))
            .expect("CreateTopics answered");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
        }
        self.wait_for_leaders(name, partitions);
    }

    /// Grows a topic to `total` partitions and waits for their leaders.
    pub fn add_partitions(&self, name: &str, total: usize) {
        let (admin, rt) = self.admin();
        let results = rt
            .block_on(admin.create_partitions(
                &[rdkafka::admin::NewPartitions::new(name, total)],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
            ))
            .expect("CreatePartitions answered");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("add partitions to {t}: {e}"));
        }
        self.wait_for_leaders(name, total as i32);
    }

    /// Deletes a topic and waits until the cluster no longer lists it.
    pub fn delete_topic(&self, name: &str) {
        let (admin, rt) = self.admin();
        let results = rt
            .block_on(admin.delete_topics(
                &[name],
                &AdminOptions::new().operation_timeout(Some(Duration::from_secs(20))),
            ))
            .expect("DeleteTopics answered");
        for r in results {
            r.unwrap_or_else(|(t, e)| panic!("delete topic {t}: {e}"));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.leader(name, 0) >= 0 {
            assert!(Instant::now() < deadline, "topic {name} still listed");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A plain consumer joins `group` (on the input topic), stays `for_`, and
/// leaves: two rebalances for the group's other members. It commits
/// nothing.
pub fn member_joins_and_leaves(bootstrap: &str, group: &str, for_: Duration) {
    let member: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    member.subscribe(&[super::INPUT]).unwrap();
    let joined = Instant::now();
    while joined.elapsed() < for_ {
        let _ = member.poll(Duration::from_millis(100));
    }
}
