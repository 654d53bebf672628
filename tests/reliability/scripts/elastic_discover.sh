#!/bin/sh
# horovodrun --host-discovery-script: the hosts and slots HOSTS_FILE holds now
cat "$HOSTS_FILE"
