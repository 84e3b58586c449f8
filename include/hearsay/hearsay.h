/* hearsay: the umbrella header of the library (libhearsay, pkg-config name "hearsay"). Includes
 * every public header; each can also be included on its own. Public names start with hs_ (and
 * HS_ for macros); nothing else is exported from libhearsay.so. */
#ifndef HEARSAY_HEARSAY_H
#define HEARSAY_HEARSAY_H

#include "hearsay/error.h"
#include "hearsay/buf.h"
#include "hearsay/tensor.h"
#include "hearsay/data.h"
#include "hearsay/model.h"
#include "hearsay/compress.h"
#include "hearsay/topo.h"
#include "hearsay/exchange.h"
#include "hearsay/algo.h"
#include "hearsay/trainer.h"
#include "hearsay/sim.h"
#include "hearsay/net.h"
#include "hearsay/checkpoint.h"
#include "hearsay/guard.h"
#include "hearsay/metrics.h"
#include "hearsay/log.h"
#include "hearsay/node.h"
#include "hearsay/peer.h"

#endif
